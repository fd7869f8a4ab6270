"""What the engine hands back to the event loop: per-choice deltas and finish reasons.

No torch here: these objects cross from the worker thread to the HTTP layer, which formats them
as OpenAI JSON or SSE chunks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class FinishReason(str, Enum):
    """OpenAI's finish reasons; ``abort`` and ``error`` never reach a successful response body."""

    STOP = "stop"  # eos, a stop string or a stop token
    LENGTH = "length"  # max_new_tokens or the context limit
    ABORT = "abort"  # client went away or the server is shutting down
    ERROR = "error"  # the request failed inside the worker; see RequestOutput.error


@dataclass
class TopLogprob:
    token_id: int
    token: str
    logprob: float


@dataclass
class TokenLogprob:
    """Log-probability of one emitted (or prompt) token under the processed distribution."""

    token_id: int
    token: str
    logprob: float | None  # None for the first prompt token (nothing predicts it)
    top: list[TopLogprob] = field(default_factory=list)


@dataclass
class SequenceDelta:
    """The increment of one choice since the previous output of its request."""

    index: int  # choice index, 0..n-1
    text: str = ""  # newly released text; held-back text (possible stop string, split UTF-8) is not here
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None
    finish_reason: FinishReason | None = None
    stop_reason: str | int | None = None  # the stop string or stop token id that ended it
    sequence_score: float | None = None  # beam search: the final beam score


@dataclass
class RequestOutput:
    """One message from the worker about one request."""

    request_id: str
    deltas: list[SequenceDelta] = field(default_factory=list)
    num_prompt_tokens: int = 0
    num_generated_tokens: int = 0  # over all choices, so far
    # speculative decoding, over all choices so far: draft tokens proposed, and those the target kept
    num_draft_tokens: int = 0
    num_accepted_draft_tokens: int = 0
    prompt_logprobs: list[TokenLogprob] | None = None  # only on the first output, when asked
    finished: bool = False  # True on the last output of the request
    error: str | None = None  # set when the request failed inside the worker
    # why it failed: "internal" (a bug, HTTP 500), "unavailable" (the server stopped or is
    # draining past its deadline, HTTP 503: the client may retry elsewhere) or "invalid_request"
    # (the request's own knobs broke it, e.g. scores overflowing to inf: HTTP 400)
    error_code: str = "internal"
    num_cached_tokens: int = 0  # prompt tokens whose K/V came from the prefix cache
