"""When a sequence ends: one checker per row, the same rules for every strategy, beams included.

HF stops a sequence with ``StoppingCriteria``: ``EosTokenCriteria``, ``MaxLengthCriteria`` (here
``max_new_tokens``, capped by the context), ``StopStringCriteria`` and ``MaxTimeCriteria``.
Decoda adds OpenAI's stop strings and vLLM's ``stop_token_ids``. The time limits live on the
request (``Request.expired``): they end every row of a request at once, and end it as
``MaxTimeCriteria`` does, gracefully, with ``finish_reason: "length"``.

Stop strings are found where the text is: a streaming row's ``DeltaStreamer`` sees every token's
text anyway (and holds back a possible stop's beginning); a beam hypothesis has no streamer, so
``StopChecker.stop_string_in`` decodes only the tail that could complete a stop string, never the
whole history (the cost of a step must not grow with the length generated). HF's own
``stop_strings`` (``decoding.stop_strings``) are checked on the token ids, prompt included, and
keep their text: they are never handed to the streamer, which trims only OpenAI's ``stop``.
"""

from __future__ import annotations

from collections.abc import Callable

from decoding.outputs import FinishReason
from decoding.params import GenerationParams
from decoding.stop_strings import StopStrings

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
        stop_strings: StopStrings | None = None,
        prompt_ids: list[int] | None = None,
    ) -> None:
        """``max_new_tokens``: the request's, already capped by the room left in the context.
        ``decode``: token ids to text, needed only to look for stop strings without a streamer.
        ``stop_strings``: HF's (kept in the output), matched over ``prompt_ids`` + generated."""
        self.eos = frozenset() if params.ignore_eos else frozenset(eos_token_ids)
        self.stop_token_ids = frozenset(params.stop_token_ids)
        self.stop = list(params.stop)
        self.max_new_tokens = max_new_tokens
        self.decode = decode
        longest = max((len(s) for s in self.stop), default=0)
        self._tail_tokens = _TOKENS_PER_CHAR * longest + _TAIL_MARGIN
        self.stop_strings = stop_strings
        self._prompt_tail = [] if stop_strings is None else list(prompt_ids or [])[-stop_strings.window :]

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

    def hf_stop_string_in(self, ids: list[int]) -> str | None:
        """The HF ``stop_strings`` entry the last of ``ids`` (prompt + generated) completes."""
        return None if self.stop_strings is None else self.stop_strings.completed_by(ids)

    def ends(self, generated_ids: list[int]) -> bool:
        """A beam hypothesis ends on a stop token or a stop string (eos and length are the
        search's own business, as in HF's beam scorer)."""
        if self.stop_strings is not None:
            tail = self._prompt_tail + generated_ids[-self.stop_strings.window :]
            if self.hf_stop_string_in(tail) is not None:
                return True
        return generated_ids[-1] in self.stop_token_ids or self.stop_string_in(generated_ids) is not None
