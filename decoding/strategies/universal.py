"""Universal assisted decoding: drafts from an assistant with a DIFFERENT tokenizer, through text.

Timor et al. 2025 / HF's ``AssistedCandidateGeneratorDifferentTokenizers``: the target's text so
far is re-encoded with the assistant's tokenizer, the assistant drafts greedily in its own tokens,
and the drafted text is re-encoded with the target's tokenizer. Two alignments keep this cheap
and robust:

- assistant side: ``AssistantText`` keeps the target's text and the assistant's ids for it
  incrementally: the text grows by incremental detokenization of the new target tokens, and only
  the text after a frozen prefix (cut at a space, where byte-level BPE and SentencePiece both
  start a token) is re-encoded, so a step costs the same at 2,000 tokens as at 100. The assistant
  keeps the K/V of the ids it shares with the new encoding and feeds only the rest;
- target side: the last few target tokens plus the drafted text are re-encoded together, and the
  new target tokens start after the longest diagonal run of matches between the old tail and the
  re-encoding that reaches the tail's end (HF's longest-diagonal idea), so a token boundary that
  moves across the join is absorbed instead of producing garbage drafts.

Drafts are only proposals: the target verifies them, so the output is the target's own whatever
the alignment does; alignment quality only moves the acceptance rate.
"""

from __future__ import annotations

from decoding.text.detokenizer import IncrementalDetokenizer

TAIL_TOKENS = 8  # target tokens re-encoded with the draft text to realign the boundary
LIVE_ASSISTANT_TOKENS = 32  # assistant tokens at the end of the text that are re-encoded each step


def common_prefix_length(a: list[int], b: list[int], start: int = 0) -> int:
    """Length of the common prefix of ``a`` and ``b``, known to be at least ``start``."""
    n = min(len(a), len(b))
    i = min(start, n)
    while i < n and a[i] == b[i]:
        i += 1
    return i


def new_tokens_after_tail(tail: list[int], encoded: list[int]) -> list[int]:
    """Tokens of ``encoded`` that follow ``tail``: after the longest diagonal run of matches
    between the two that ends at the tail's last token; none when no run reaches it."""
    best_length, best_end = 0, -1
    for j in range(len(encoded)):  # encoded[j] aligned with tail[-1]
        length = 0
        while length <= j and length < len(tail) and encoded[j - length] == tail[len(tail) - 1 - length]:
            length += 1
        if length > best_length:
            best_length, best_end = length, j
    if best_length == 0:
        return []
    return encoded[best_end + 1 :]


class AssistantText:
    """The assistant's ids for the target's text so far, maintained as the target's history grows."""

    def __init__(self, target_tokenizer: object, assistant_tokenizer: object, prompt_ids: list[int]) -> None:
        self.assistant_tokenizer = assistant_tokenizer
        self._prompt_text = target_tokenizer.decode(prompt_ids)
        self._generated = IncrementalDetokenizer(target_tokenizer, prompt_ids, skip_special_tokens=False)
        self._num_target = len(prompt_ids)
        self._frozen_chars = 0  # text[:frozen_chars] is encoded once and for all as frozen_ids
        self.frozen_ids: list[int] = []

    def ids_for(self, history: list[int]) -> list[int]:
        """The assistant's ids for the text of ``history`` (the prompt plus the generated ids)."""
        self._generated.add(history[self._num_target :])
        self._num_target = len(history)
        tail = (self._prompt_text + self._generated.text)[self._frozen_chars :]
        encoded = self.assistant_tokenizer(tail, add_special_tokens=False, return_offsets_mapping=True)
        tail_ids, offsets = list(encoded["input_ids"]), encoded["offset_mapping"]
        ids = self.frozen_ids + tail_ids
        if len(tail_ids) > 2 * LIVE_ASSISTANT_TOKENS:
            self._freeze(tail, tail_ids, offsets)
        return ids

    def _freeze(self, tail: str, tail_ids: list[int], offsets: list[tuple[int, int]]) -> None:
        """Freeze the tokens before a space well behind the end; the rest stays live."""
        keep_from = offsets[len(tail_ids) - LIVE_ASSISTANT_TOKENS][0]
        cut = tail.rfind(" ", 0, keep_from + 1)
        count = sum(1 for _, end in offsets if end <= cut)
        if cut > 0 and count:
            self.frozen_ids = self.frozen_ids + tail_ids[:count]
            self._frozen_chars += offsets[count - 1][1]


def target_drafts(history: list[int], draft_text: str, target_tokenizer: object, count: int) -> list[int]:
    """Target-token drafts for ``draft_text`` continuing ``history``."""
    if not draft_text:
        return []
    tail = history[-TAIL_TOKENS:]
    tail_text = target_tokenizer.decode(tail)
    encoded = list(target_tokenizer.encode(tail_text + draft_text, add_special_tokens=False))
    return new_tokens_after_tail(tail, encoded)[:count]
