"""Per-sequence text stream: token ids in, released text out, cut at the first stop string.

The engine owns the request and drives one ``DeltaStreamer`` per returned sequence: ``put()``
with each step's new tokens, ``end()`` once when the sequence finishes for any reason (eos,
length, stop token, timeout, abort), and ``take()`` to collect the text released since the last
delta for the ``SequenceDelta``. It speaks HF's ``BaseStreamer`` interface so the same object can
also be passed to ``model.generate(streamer=...)`` (with ``skip_prompt=True``, since HF puts the
prompt first), which is how parity tests compare streamed text with HF's.

Two things are held back from the stream: half a UTF-8 character (``IncrementalDetokenizer``) and
any tail that could still become a stop string (``StopStringMatcher``), so a client never sees
text that is later retracted.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from transformers.generation.streamers import BaseStreamer

from decoding.text.detokenizer import IncrementalDetokenizer
from decoding.text.stop import StopStringMatcher


class DeltaStreamer(BaseStreamer):
    """Detokenizer + stop-string matcher for one sequence, collecting text for the engine.

    ``put(value)`` accepts an int, a list of ints or a 1-D (or ``[1, n]``) tensor of new token
    ids. Once a stop string matched, ``stopped`` is True, ``stop_reason`` names it, and further
    puts release nothing (the engine should finish the sequence). ``end()`` flushes what was
    held: an incomplete character and a stop-string prefix that never completed are released
    then. ``end()`` is idempotent. Released text is both accumulated for ``take()`` and, when
    given, passed to ``on_text`` as it is released.
    """

    def __init__(
        self,
        tokenizer: Any,
        prompt_ids: list[int],
        stop: Iterable[str] = (),
        skip_special_tokens: bool = True,
        on_text: Callable[[str], None] | None = None,
        skip_prompt: bool = False,
    ) -> None:
        self.detokenizer = IncrementalDetokenizer(tokenizer, prompt_ids, skip_special_tokens)
        self.matcher = StopStringMatcher(stop)
        self.on_text = on_text
        self._skip_next_put = skip_prompt
        self._pending: list[str] = []
        self._released: list[str] = []
        self.ended = False

    @property
    def stopped(self) -> bool:
        return self.matcher.matched is not None

    @property
    def stop_reason(self) -> str | None:
        """The stop string that ended the sequence, or None."""
        return self.matcher.matched

    @property
    def text(self) -> str:
        """All text released so far (taken or not)."""
        return "".join(self._released)

    def put(self, value: Any) -> None:
        if self._skip_next_put:
            self._skip_next_put = False
            return
        if self.stopped or self.ended:
            return
        text = self.detokenizer.add(_as_token_ids(value))
        released, _ = self.matcher.push(text)
        self._emit(released)

    def end(self) -> None:
        if self.ended:
            return
        self.ended = True
        if self.stopped:
            return
        released, matched = self.matcher.push(self.detokenizer.flush())
        if matched is None:
            released += self.matcher.flush()
        self._emit(released)

    def take(self) -> str:
        """Text released since the previous ``take()``."""
        text = "".join(self._pending)
        self._pending.clear()
        return text

    def _emit(self, text: str) -> None:
        if not text:
            return
        self._pending.append(text)
        self._released.append(text)
        if self.on_text is not None:
            self.on_text(text)


def _as_token_ids(value: Any) -> list[int]:
    """Normalizes what ``put`` receives: int, list of ints, or a 1-D / ``[1, n]`` tensor."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, int):
        return [value]
    if value and isinstance(value[0], list):
        if len(value) != 1:
            raise ValueError(f"DeltaStreamer streams one sequence, got a batch of {len(value)}")
        value = value[0]
    return [int(token) for token in value]
