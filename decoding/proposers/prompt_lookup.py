"""Prompt lookup drafts: copy what followed an earlier occurrence of the text's last n-gram.

Saxena 2023 ("Prompt Lookup Decoding", https://github.com/apoorvumang/prompt-lookup-decoding), as
HF implements it in ``PromptLookupCandidateGenerator.get_candidates`` (transformers 5.23). Inputs
that quote or edit their prompt (summaries, code edits, RAG answers) repeat long spans of it, so the
tokens that followed an earlier occurrence of the last few tokens are cheap, often-right drafts that
need no model at all.

This function returns exactly the draft tokens HF's class appends to ``input_ids`` for the same ids
and settings, including HF's quirks, so a user's HF knowledge (and HF's acceptance counts) carry
over:

- n-gram sizes are tried from ``min(max_matching_ngram_size, len - 1)`` down to 1; for each size the
  occurrences are scanned left to right and the FIRST one with a non-empty continuation wins (not
  the longest or the most recent continuation);
- the continuation is copied from ``token_ids`` only, so it ends at the current end of the text:
  ``end = min(start + num_tokens, len(token_ids), max_length)``. HF clips with ``max_length`` as
  an index into ``input_ids``, which in practice never binds (the text is shorter than
  ``max_length``); the drafts are NOT clipped to the remaining token budget, HF's assisted loop
  crops the verified tokens to ``max_length`` afterwards;
- the only length rule on the drafts' side: when ``max_length == len(token_ids) + 1`` (exactly
  one token left) there are no drafts;
- with ``is_allowed`` (HF's logits-processor check) a continuation is cut before its first
  forbidden token; a continuation cut to nothing moves on to the next occurrence;
- the first accepted continuation is then cut before its first eos token, so the target cannot
  accept eos and keep going; a continuation cut to nothing by eos gives NO drafts (HF does not
  look further).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

AllowedFn = Callable[[list[int], int], bool]
"""``is_allowed(prefix_ids, token_id)``: may ``token_id`` follow ``prefix_ids`` (the text so far plus
the drafts before it)? HF asks its logits processors: a token whose processed fake logit is -inf
(or the dtype's min) is forbidden."""


def propose_prompt_lookup(
    token_ids: Sequence[int],
    num_tokens: int,
    max_matching_ngram_size: int = 2,
    *,
    eos_token_ids: Collection[int] = (),
    max_length: int | None = None,
    is_allowed: AllowedFn | None = None,
) -> list[int]:
    """Draft tokens for ``token_ids`` (prompt + generated so far), HF's prompt lookup exactly.

    ``num_tokens`` is ``prompt_lookup_num_tokens``; ``max_matching_ngram_size`` is HF's knob of that
    name (HF's ``generate`` passes ``max_matching_ngram_size or 2``); ``max_length`` is the
    generation's total ``max_length`` (prompt included) or None for no limit. Returns ``[]`` when
    nothing matches, which makes the step a plain decoding step.
    """
    if max_matching_ngram_size <= 0 or num_tokens <= 0:
        raise ValueError("Invalid max_matching_ngram_size or num_tokens")  # HF raises the same
    ids = list(token_ids)
    length = len(ids)
    if max_length is not None and max_length == length + 1:
        return []  # the target's own next token uses up the last position
    limit = length if max_length is None else min(length, max_length)
    eos = set(eos_token_ids)
    for size in range(min(max_matching_ngram_size, length - 1), 0, -1):
        tail = ids[length - size :]
        first = tail[0]
        for start in range(length - size + 1):  # left to right; the tail itself has nothing after it
            if ids[start] != first or ids[start : start + size] != tail:
                continue
            begin = start + size
            end = min(begin + num_tokens, limit)
            if begin >= end:
                continue
            chosen = ids[begin:end]
            if is_allowed is not None:
                chosen = _cut_at_forbidden(ids, chosen, is_allowed)
                if not chosen:
                    continue  # HF looks at the next occurrence
            for i, token in enumerate(chosen):
                if token in eos:
                    return chosen[:i]  # possibly empty: HF stops looking here too
            return chosen
    return []


def _cut_at_forbidden(ids: list[int], chosen: list[int], is_allowed: AllowedFn) -> list[int]:
    for i, token in enumerate(chosen):
        if not is_allowed(ids + chosen[:i], token):
            return chosen[:i]
    return chosen
