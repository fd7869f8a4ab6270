"""HF's ``stop_strings``: ``StopStringCriteria``'s decision, made on one row's last few tokens.

Two kinds of stop strings, on purpose: OpenAI's ``stop`` cuts the text before the stop string
(``decoding.streamer``'s ``StopStringMatcher``), while HF's ``stop_strings`` end generation as
soon as a token completes one and KEEP every generated token, the completing one included, as
``generate(stop_strings=..., tokenizer=...)`` returns them.

The rule is HF's: it matches on the tokens' *clean* vocabulary strings (bytes for byte-level
tokenizers such as SmolLM2's), over ``input_ids`` (the prompt too: a stop string may begin there),
looking at the last ``maximum_token_len`` tokens only; the final token must hold the stop string's
end but may run past it. HF precomputes, per set of stop strings, where every vocabulary token can
sit inside every stop string: a Python pass over the whole vocabulary (1.5 to 3 s for SmolLM2's
49152 tokens, and its cache misses because ``get_vocab()`` comes back in a new order each time),
which would stall the continuous batch for every request. The same decision is made here directly:
the window's clean strings are joined and the stop string must end inside the final token, which
is what HF's position tables encode. The clean vocabulary comes from HF's own
``clean_tokenizer_vocab`` and matching mode, once per tokenizer (about a second, at the first
request that sets ``stop_strings``). tests/test_stop_strings.py holds this to ``StopStringCriteria``.
"""

from __future__ import annotations

import threading

from transformers.generation.stopping_criteria import StopStringCriteria

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
