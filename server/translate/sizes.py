"""Every size a body can overrun, checked in one pass before any template, tokenizer or compiler runs.

The limits are one table, ``decoding.params.SIZE_LIMITS`` (which ``decoding.params.validate`` applies
to the knobs' lists and ``/openapi.json`` states); a body adds its own lists (``sized_lists``: the
prompts, the messages, the tools) and every text the server will render or tokenize
(``rendered_texts``: prompts, message contents and names, tool-call arguments, the tools' JSON, a
negative prompt), which must fit the context in characters before a tokenizer sees it
(``EngineClient.check_text_size``). Each API's protocol declares those two; this check is the same
for all of them, so nothing an API renders can escape it.
"""

from __future__ import annotations

from decoding import EngineClient
from decoding.params import check_size
from server.translate.fields import GenerationFields


def check_body_sizes(client: EngineClient, body: GenerationFields) -> None:
    """A 400 naming the field for the first list over its limit or text that cannot fit the context."""
    for name, items in body.sized_lists().items():
        check_size(name, items)
    for param, texts in body.rendered_texts().items():
        client.check_text_size(texts, param)
