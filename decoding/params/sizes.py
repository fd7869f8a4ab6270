"""How long each list-valued field may be: the one table ``validate``, the structured-output check and
the server's body check (``server/translate/sizes.py``) enforce and ``/openapi.json`` states.

Without a limit, one valid request can hand the worker a list it walks for every row at every
step (a 3 MB ``bad_words_ids`` with ``n: 64`` made every step seconds long for everyone). The
per-step cost of the token lists no longer grows with their length (``sampling/token_rules.py``
builds a ban set and a prefix trie once per request); these limits bound what is left: the
parsing, checking and one-time building, and the memory a request holds. OpenAI's own limit is
used where it has one; the others are well above any use seen in HF's or vLLM's docs.
"""

from __future__ import annotations

from collections.abc import Sized
from dataclasses import dataclass

from decoding.params.errors import ParameterError


@dataclass(frozen=True)
class SizeLimit:
    """At most ``max_items`` entries, each at most ``max_item`` long (characters or token ids)."""

    max_items: int
    max_item: int | None = None
    item_unit: str = ""  # what max_item counts: "characters" or "token ids"
    items_unit: str = "entries"

    def json_schema(self, kind: str = "array") -> dict[str, int]:
        """JSON Schema keywords for the container (``array``, ``object``) and its items."""
        return {"maxProperties" if kind == "object" else "maxItems": self.max_items}

    def item_schema(self, kind: str) -> dict[str, int]:
        """Keywords for one item: ``string`` (maxLength) or ``array`` (maxItems)."""
        if self.max_item is None:
            return {}
        return {"maxLength" if kind == "string" else "maxItems": self.max_item}


MAX_VOCAB = 262_144  # the largest vocabulary of a served family (Gemma 3): a longer id list only repeats
SIZE_LIMITS: dict[str, SizeLimit] = {
    # OpenAI allows 4 stop sequences and TGI 4 by default; 16 covers templates' stop sets copied from
    # vLLM deployments; the length bounds the text the streamer holds back
    "stop": SizeLimit(16, 512, "characters", "stop sequences"),
    "stop_strings": SizeLimit(16, 512, "characters", "stop strings"),
    "stop_token_ids": SizeLimit(1024, items_unit="token ids"),
    "logit_bias": SizeLimit(300, items_unit="token ids"),  # OpenAI's limit
    "bad_words_ids": SizeLimit(1024, 32, "token ids", "sequences"),
    "sequence_bias": SizeLimit(1024, 32, "token ids", "sequences"),
    "suppress_tokens": SizeLimit(MAX_VOCAB, items_unit="token ids"),
    "begin_suppress_tokens": SizeLimit(MAX_VOCAB, items_unit="token ids"),
    "dola_layers": SizeLimit(256, items_unit="layer indices"),
    "prompt": SizeLimit(128, items_unit="prompts"),  # a list of prompts: each is its own engine request
    "messages": SizeLimit(2048, items_unit="messages"),
    "tools": SizeLimit(128, items_unit="tools"),  # OpenAI's limit
    # a structured output: its choices, and its schema, regex or grammar serialised (what one request may
    # make the compiler read)
    "choice": SizeLimit(1_000, items_unit="choices"),
    "structured_output": SizeLimit(64_000, items_unit="characters serialised"),
    # the tools a request offers, serialised: each call's grammar holds them all, so what is accepted
    # here always compiles (llguidance's symbol table overflows near 1.4M characters of schemas)
    "tool_definitions": SizeLimit(256_000, items_unit="characters serialised"),
    "tool_grammar": SizeLimit(256_000 + 128 * 512, items_unit="characters serialised"),  # + each call's frame
}


def check_size(name: str, items: Sized | None, param: str | None = None) -> None:
    """A 400 naming ``param`` (default ``name``) when ``items`` is over ``SIZE_LIMITS[name]``;
    inner items are measured with ``len`` (a string's characters, an id list's ids)."""
    if items is None:
        return
    limit, param = SIZE_LIMITS[name], param or name
    if len(items) > limit.max_items:
        raise ParameterError(
            f"{param} may have at most {limit.max_items} {limit.items_unit}, got {len(items)}",
            param=param,
            code="too_many_items",
        )
    if limit.max_item is None:
        return
    for i, item in enumerate(items):
        inner = item[0] if name == "sequence_bias" and isinstance(item, (list, tuple)) and item else item
        if isinstance(inner, Sized) and len(inner) > limit.max_item:
            raise ParameterError(
                f"{param}[{i}] may have at most {limit.max_item} {limit.item_unit}, got {len(inner)}",
                param=param,
                code="too_long",
            )


def check_sizes(params: object) -> None:
    """Every list-valued generation field of ``params`` (a ``GenerationParams``) within its limit;
    checked first, before any other check walks the lists."""
    for name in ("stop", "stop_strings", "stop_token_ids", "logit_bias", "bad_words_ids", "sequence_bias",
                 "suppress_tokens", "begin_suppress_tokens"):  # fmt: skip
        check_size(name, getattr(params, name))
    dola = params.dola_layers
    if isinstance(dola, list):
        check_size("dola_layers", dola)
