"""When a sequence ends: one checker per row, the same rules for every strategy, beams included.

HF stops a sequence with ``StoppingCriteria``: ``EosTokenCriteria``, ``MaxLengthCriteria`` (here
``max_new_tokens``, capped by the context), ``StopStringCriteria`` and ``MaxTimeCriteria``.
Decoda adds OpenAI's stop strings and vLLM's ``stop_token_ids``. The time limits live on the
request (``Request.expired``): they end every row of a request at once, and end it as
``MaxTimeCriteria`` does, gracefully, with ``finish_reason: "length"``.

Stop strings are found where the text is: a streaming row's ``DeltaStreamer`` sees every token's
text anyway (and holds back a possible stop's beginning); a beam hypothesis has no streamer, so
``StopChecker.stop_string_in`` decodes only the tail that could complete a stop string, never the
whole history (the cost of a step must not grow with the length generated).
"""

from __future__ import annotations

from collections.abc import Callable

from decoding.outputs import FinishReason
from decoding.params import GenerationParams

# Tokens decoded per character of the longest stop string when a beam checks its tail: a token
# can be a single byte of a multi-byte character, so four tokens per character, plus a margin
# for the token that starts mid-character.
_TOKENS_PER_CHAR = 4
_TAIL_MARGIN = 4

Finish = tuple[FinishReason, str | int | None]


class StopChecker:
    def __init__(
        self,
        params: GenerationParams,
        eos_token_ids: set[int],
        max_new_tokens: int,
        decode: Callable[[list[int]], str] | None = None,
    ) -> None:
        """``max_new_tokens``: the request's, already capped by the room left in the context.
        ``decode``: token ids to text, needed only to look for stop strings without a streamer."""
        self.eos = frozenset() if params.ignore_eos else frozenset(eos_token_ids)
        self.stop_token_ids = frozenset(params.stop_token_ids)
        self.stop = list(params.stop)
        self.max_new_tokens = max_new_tokens
        self.decode = decode
        longest = max((len(s) for s in self.stop), default=0)
        self._tail_tokens = _TOKENS_PER_CHAR * longest + _TAIL_MARGIN

    def token_stop(self, token: int) -> Finish | None:
        """A stop decided by the token id alone: eos (unless ignore_eos) or a stop token."""
        if token in self.eos:
            return FinishReason.STOP, None
        if token in self.stop_token_ids:
            return FinishReason.STOP, token
        return None

    def length_reached(self, num_generated: int) -> bool:
        return num_generated >= self.max_new_tokens

    def stop_string_in(self, generated_ids: list[int]) -> str | None:
        """The stop string that the LAST token of ``generated_ids`` completes, if any.

        Earlier tokens were checked when they were generated (a hypothesis that contained a stop
        would have ended there), so only the tail that can hold a stop ending now is decoded.
        """
        if not self.stop or not generated_ids:
            return None
        text = self.decode(generated_ids[-self._tail_tokens :])
        found = [(text.find(s), s) for s in self.stop if s in text]
        return min(found)[1] if found else None

    def ends(self, generated_ids: list[int]) -> bool:
        """A beam hypothesis ends on a stop token or a stop string (eos and length are the
        search's own business, as in HF's beam scorer)."""
        return generated_ids[-1] in self.stop_token_ids or self.stop_string_in(generated_ids) is not None
