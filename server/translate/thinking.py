"""A thinking budget as the engine takes it: the reasoning parser's tags as token ids.

The engine forces the end tag's ids once a reply has thought ``budget`` tokens
(``decoding.params.thinking``); the tags are the parser's (``server.output.reasoning``), tokenized
here, off the event loop, without special tokens (a reasoning model's ``</think>`` is one added
token; another model's is the ids it would write). A format whose reply opens its own thinking
(qwen3, think) also gives the opening tag's ids, so only a reply that opens a block is budgeted.
"""

from __future__ import annotations

from decoding import EngineClient, GenerationParams
from decoding.params.thinking import validate_thinking
from server.output.reasoning import END, START, ReasoningFormat


async def with_thinking_budget(
    client: EngineClient, params: GenerationParams, reasoning: ReasoningFormat, budget: int | None
) -> GenerationParams:
    """``params`` whose thinking ends within ``budget`` tokens (None: unchanged)."""
    if budget is None:
        return params
    end_ids = await client.tokenize(END, add_special_tokens=False)
    start_ids = None if reasoning.opened_by_prompt else await client.tokenize(START, add_special_tokens=False)
    params = params.replace(thinking_budget=budget, thinking_end_ids=list(end_ids),
                            thinking_start_ids=list(start_ids) if start_ids is not None else None)  # fmt: skip
    validate_thinking(params)
    return params
