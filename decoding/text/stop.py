"""Every stop rule in one place: eos, stop token ids, OpenAI's ``stop``, HF's ``stop_strings``, length.

One ``StopChecker`` per row serves every strategy, beams included. HF stops a sequence with
``StoppingCriteria``: ``EosTokenCriteria``, ``MaxLengthCriteria`` (here ``max_new_tokens``, capped
by the context), ``StopStringCriteria`` and ``MaxTimeCriteria``. Decoda adds OpenAI's ``stop``
and vLLM's ``stop_token_ids``. The time limits live on the request (``Request.expired``): they end
every row of a request at once, and end it as ``MaxTimeCriteria`` does, gracefully, with
``finish_reason: "length"``. A structured output ends its row when its grammar is complete.
``StopChecker.finish_after`` is the one order in which a row's new
token is checked: its id (eos, stop ids), OpenAI's ``stop`` in the streamed text, HF's
``stop_strings`` on the ids, then the length.

Two kinds of stop strings, on purpose:

- OpenAI's ``stop`` cuts the text before the stop string (``StopStringMatcher``). It is found where
  the text is: a streaming row's ``DeltaStreamer`` sees every token's text anyway (and holds back a
  possible stop's beginning); a beam hypothesis has no streamer, so ``StopChecker.stop_string_in``
  decodes only the tail that could complete a stop string, never the whole history (the cost of a
  step must not grow with the length generated).
- HF's ``stop_strings`` (``StopStrings``) end generation as soon as a token completes one and KEEP
  every generated token, the completing one included, as ``generate(stop_strings=...,
  tokenizer=...)`` returns them. They are checked on the token ids, prompt included, and are never
  handed to the streamer.

HF's rule for ``stop_strings``: it matches on the tokens' *clean* vocabulary strings (bytes for
byte-level tokenizers such as SmolLM2's), over ``input_ids`` (the prompt too: a stop string may
begin there), looking at the last ``maximum_token_len`` tokens only; the final token must hold the
stop string's end but may run past it. HF precomputes, per set of stop strings, where every
vocabulary token can sit inside every stop string: a Python pass over the whole vocabulary (1.5 to
3 s for SmolLM2's 49152 tokens, and its cache misses because ``get_vocab()`` comes back in a new
order each time), which would stall the continuous batch for every request. The same decision is
made here directly: the window's clean strings are joined and the stop string must end inside the
final token, which is what HF's position tables encode. The clean vocabulary comes from HF's own
``clean_tokenizer_vocab`` and matching mode, once per tokenizer (about a second, at the first
request that sets ``stop_strings``). tests/test_stop_strings.py holds this to ``StopStringCriteria``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Protocol

from transformers.generation.stopping_criteria import StopStringCriteria

from decoding.outputs import FinishReason
from decoding.params import GenerationParams


class StopStringMatcher:
    """Cuts a text stream right before the first stop string, never leaking part of one.

    Which stop wins: the one that *completes first* in the text; among stops completing at the
    same character, the one starting earliest (the longest). So with ``["ab", "abc"]`` the text
    ``"xabc"`` stops at ``"ab"`` (released ``"x"``), and with ``["abc", "bc"]`` it stops at
    ``"abc"``. This is the rule a token-by-token generator can follow without generating past a
    completed stop string (HF's ``StopStringCriteria`` also stops as soon as one completes), and it
    makes the result independent of how the text is chunked across ``push`` calls. The stop
    string itself is excluded from the released text, as in OpenAI's API.
    """

    def __init__(self, stop: Iterable[str]) -> None:
        self.stop = sorted({s for s in stop if s}, key=len)
        self._held = ""
        self.matched: str | None = None

    @property
    def held(self) -> str:
        """Text withheld because it could be the start of a stop string."""
        return self._held

    def push(self, text: str) -> tuple[str, str | None]:
        """Adds text; returns (text safe to release, the stop string matched now or None).

        After a match nothing more is released, by this or any later call.
        """
        if self.matched is not None:
            return "", None
        buffer = self._held + text
        match = self._first_match(buffer)
        if match is not None:
            start, stop = match
            self.matched, self._held = stop, ""
            return buffer[:start], stop
        num_held = self._num_prefix_chars(buffer)
        self._held = buffer[len(buffer) - num_held :]
        return buffer[: len(buffer) - num_held], None

    def flush(self) -> str:
        """Releases the held tail: the stream ended before it could complete a stop string."""
        held, self._held = ("" if self.matched is not None else self._held), ""
        return held

    def _first_match(self, buffer: str) -> tuple[int, str] | None:
        best: tuple[int, int, str] | None = None  # (end, start, stop)
        for stop in self.stop:
            start = buffer.find(stop)
            if start < 0:
                continue
            candidate = (start + len(stop), start, stop)
            if best is None or candidate[:2] < best[:2]:
                best = candidate
        return None if best is None else (best[1], best[2])

    def _num_prefix_chars(self, buffer: str) -> int:
        """Length of the longest tail of ``buffer`` that is a proper prefix of some stop string."""
        longest = min(len(buffer), max((len(s) - 1 for s in self.stop), default=0))
        for size in range(longest, 0, -1):
            tail = buffer[-size:]
            if any(s.startswith(tail) for s in self.stop):
                return size
        return 0


# ---- HF stop_strings ------------------------------------------------------------------------------
_VOCABS: dict[int, tuple[object, str | None, list[str | bytes]]] = {}  # id(tokenizer) -> (it, mode, clean)
_LOCK = threading.Lock()


def _clean_vocab(tokenizer: object) -> tuple[str | None, list[str | bytes]]:
    """(HF's matching mode, every token id's clean string), computed once per tokenizer."""
    with _LOCK:
        cached = _VOCABS.get(id(tokenizer))
        if cached is None or cached[0] is not tokenizer:
            mode = StopStringCriteria._get_stop_string_matching_mode(tokenizer)
            tokens, indices = StopStringCriteria.clean_tokenizer_vocab(tokenizer, stop_string_matching_mode=mode)
            clean: list[str | bytes] = [b"" if mode else ""] * (max(indices) + 1)
            for token, index in zip(tokens, indices, strict=True):
                clean[index] = token
            cached = _VOCABS[id(tokenizer)] = (tokenizer, mode, clean)
        return cached[1], cached[2]


class StopStrings:
    """One request's HF stop strings; ``completed_by`` is asked once per appended token."""

    def __init__(self, tokenizer: object, strings: list[str]) -> None:
        self.strings = list(strings)
        mode, self._clean = _clean_vocab(tokenizer)
        self._targets = list(StopStringCriteria._get_stop_strings_for_matching(tuple(self.strings), mode))
        self._empty = b"" if mode else ""
        self.window = max(len(target) for target in self._targets)  # HF's maximum_token_len

    def completed_by(self, ids: list[int]) -> str | None:
        """The stop string the last id of ``ids`` (prompt + generated) completes, or None."""
        pieces = [self._clean[i] if 0 <= i < len(self._clean) else self._empty for i in ids[-self.window :]]
        if not pieces or not pieces[-1]:
            return None  # HF: a token with no text cannot end a stop string
        text = self._empty.join(pieces)
        last = len(pieces[-1])
        for target, string in zip(self._targets, self.strings, strict=True):
            # the stop string ends inside the final token: it may run past the end by up to last - 1
            if any(text.endswith(target, 0, len(text) - overhang) for overhang in range(last)):
                return string
        return None


# ---- one checker per row ---------------------------------------------------------------------------
# Tokens decoded per character of the longest stop string when a beam checks its tail: a token
# can be a single byte of a multi-byte character, so four tokens per character, plus a margin
# for the token that starts mid-character.
_TOKENS_PER_CHAR = 4
_TAIL_MARGIN = 4

Finish = tuple[FinishReason, str | int | None]


class TextStream(Protocol):
    """What ``finish_after`` needs of a row's streamer (``decoding.text.streamer.DeltaStreamer``)."""

    stop_reason: str | None

    def put(self, value: list[int]) -> None: ...


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

    def finish_after(
        self, token: int, stream: TextStream, ids: list[int], num_generated: int, grammar_done: bool = False
    ) -> Finish | None:
        """Whether a streaming row ends with ``token``, its text already in ``stream`` when it goes on.

        The one order every row follows: the token's id (eos, a stop token; its text is never
        streamed), OpenAI's ``stop`` in the streamed text (trimmed there), HF's ``stop_strings`` on
        ``ids`` (prompt + generated, the token included; kept in the text), a structured output's
        grammar complete with this token (``grammar_done``: nothing but eos could follow), then the
        length.
        """
        finish = self.token_stop(token)
        if finish is not None:
            return finish
        stream.put([token])
        if stream.stop_reason is not None:
            return FinishReason.STOP, stream.stop_reason
        hf_stop = self.hf_stop_string_in(ids)
        if hf_stop is not None:  # HF's: the text stays in the output
            return FinishReason.STOP, hf_stop
        if grammar_done:
            return FinishReason.STOP, None
        if self.length_reached(num_generated):
            return FinishReason.LENGTH, None
        return None
