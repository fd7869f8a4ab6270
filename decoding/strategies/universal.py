"""Universal assisted decoding: drafts from an assistant with a DIFFERENT tokenizer, through text.

Timor et al. 2025 / HF's ``AssistedCandidateGeneratorDifferentTokenizers``: the target's text so
far is re-encoded with the assistant's tokenizer, the assistant drafts greedily in its own tokens,
and the drafted text is re-encoded with the target's tokenizer. Two alignments keep this cheap
and robust:

- assistant side: the assistant's ids for the whole text are compared with those it already has
  cached; it keeps the common prefix and only feeds the rest (re-tokenisation changes only near the
  end of the text);
- target side: the last few target tokens plus the drafted text are re-encoded together, and the
  new target tokens start after the longest diagonal run of matches between the old tail and the
  re-encoding that reaches the tail's end (HF's longest-diagonal idea), so a token boundary that
  moves across the join is absorbed instead of producing garbage drafts.

Drafts are only proposals: the target verifies them, so the output is the target's own whatever
the alignment does; alignment quality only moves the acceptance rate.
"""

from __future__ import annotations

TAIL_TOKENS = 8  # target tokens re-encoded with the draft text to realign the boundary


def common_prefix_length(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
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


def assistant_ids_for(text: str, assistant_tokenizer: object) -> list[int]:
    return list(assistant_tokenizer.encode(text, add_special_tokens=False))


def target_drafts(history: list[int], draft_text: str, target_tokenizer: object, count: int) -> list[int]:
    """Target-token drafts for ``draft_text`` continuing ``history``."""
    if not draft_text:
        return []
    tail = history[-TAIL_TOKENS:]
    tail_text = target_tokenizer.decode(tail)
    encoded = list(target_tokenizer.encode(tail_text + draft_text, add_special_tokens=False))
    return new_tokens_after_tail(tail, encoded)[:count]
