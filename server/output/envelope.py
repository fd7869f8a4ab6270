"""What every API's output formatter shares: ids, the creation time, the chunk envelope, usage.

An API's formatter (``server.api.<name>.format``) derives from ``Envelope`` and adds ``chunks``
(one engine output to that API's stream events) and ``body`` (the collected outputs to its final
JSON); ``server.output.streaming`` drives either. Usage is counted on the way, per prompt, so a
stream's usage chunk and a body's usage agree.
"""

from __future__ import annotations

import time

from decoding import RequestOutput
from server.output.collect import Collected


def now() -> int:
    return int(time.time())


def usage(
    prompt_tokens: int, completion_tokens: int, drafts: tuple[int, int] = (0, 0), cached: int = 0,
    reasoning_tokens: int | None = None,
) -> dict:  # fmt: skip
    """OpenAI's usage object. ``completion_tokens_details`` as OpenAI's: ``reasoning_tokens`` (the
    reply's tokens that fell in its thinking, ``server.output.reasoning``) and the Predicted Outputs
    fields ``accepted_prediction_tokens`` / ``rejected_prediction_tokens`` (a speculating request's
    drafts: a client reads its acceptance rate from them; the openai client parses them). Chat always
    has them (``reasoning_tokens`` given); legacy completions only when the request drafted. Unlike
    OpenAI's, rejected drafts are not counted in ``completion_tokens``. Prompt tokens served from the
    prefix cache are ``prompt_tokens_details.cached_tokens``, as OpenAI's."""
    body: dict = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    if cached:
        body["prompt_tokens_details"] = {"cached_tokens": cached}
    num_drafted, num_accepted = drafts
    if num_drafted or reasoning_tokens is not None:
        body["completion_tokens_details"] = {
            **({"reasoning_tokens": reasoning_tokens} if reasoning_tokens is not None else {}),
            "accepted_prediction_tokens": num_accepted,
            "rejected_prediction_tokens": num_drafted - num_accepted,
        }
    return body


def _sum_drafts(drafts: list[tuple[int, int]]) -> tuple[int, int]:
    return sum(d[0] for d in drafts), sum(d[1] for d in drafts)


class Envelope:
    """What both endpoints share: ids, the chunk envelope, usage counting, per-choice extensions."""

    object_name = ""
    chunk_object = ""

    def __init__(
        self, request_id: str, model: str, n: int, *, return_token_ids: bool = False, include_usage: bool = False
    ) -> None:
        self.request_id, self.model, self.n = request_id, model, n
        self.return_token_ids = return_token_ids
        self.include_usage = include_usage
        self.created = now()
        self._prompt_tokens: dict[int, int] = {}  # per prompt index, as the stream reports them
        self._cached_tokens: dict[int, int] = {}  # ... and those the prefix cache supplied
        self._completion_tokens = 0
        self._drafts: dict[int, tuple[int, int]] = {}  # per prompt index: (proposed, accepted) so far

    def _count(self, prompt_index: int, output: RequestOutput) -> None:
        self._prompt_tokens[prompt_index] = output.num_prompt_tokens
        self._cached_tokens[prompt_index] = output.num_cached_tokens
        self._completion_tokens += sum(len(delta.token_ids) for delta in output.deltas)
        self._drafts[prompt_index] = (output.num_draft_tokens, output.num_accepted_draft_tokens)

    def _chunk(self, choices: list[dict]) -> dict:
        return {"id": self.request_id, "object": self.chunk_object, "created": self.created, "model": self.model,
                "choices": choices, "usage": None}  # fmt: skip

    def usage_chunk(self) -> dict:
        drafts = _sum_drafts(list(self._drafts.values()))
        prompt, cached = sum(self._prompt_tokens.values()), sum(self._cached_tokens.values())
        counts = usage(prompt, self._completion_tokens, drafts, cached, self._streamed_reasoning_tokens())
        return {**self._chunk([]), "usage": counts}

    def _streamed_reasoning_tokens(self) -> int | None:
        """The streamed reply's reasoning tokens so far (None: an API whose usage has no such field)."""
        return None

    def _body(self, choices: list[dict], results: list[Collected], reasoning_tokens: int | None = None) -> dict:
        prompt_tokens = sum(r.num_prompt_tokens for r in results)
        completion_tokens = sum(len(c.token_ids) for r in results for c in r.choices.values())
        drafts = _sum_drafts([r.drafts for r in results])
        cached = sum(r.num_cached_tokens for r in results)
        return {"id": self.request_id, "object": self.object_name, "created": self.created, "model": self.model,
                "choices": choices,
                "usage": usage(prompt_tokens, completion_tokens, drafts, cached, reasoning_tokens)}  # fmt: skip

    def _extend(self, choice: dict, token_ids: list[int], sequence_score: float | None) -> dict:
        """Serving extensions: ``return_token_ids``, and beam search's ``sequence_score``."""
        if self.return_token_ids:
            choice["token_ids"] = token_ids
        if sequence_score is not None:
            choice["sequence_score"] = sequence_score
        return choice
