"""Universal assisted decoding: moving ids between two tokenizers through text, and re-aligning them.

Timor et al. 2025 ("Accelerating LLM Inference with Lossless Speculative Decoding Algorithms for
Heterogeneous Vocabularies"; https://huggingface.co/blog/universal_assisted_generation), as HF
implements it in ``AssistedCandidateGeneratorDifferentTokenizers`` (transformers 5.23). An
assistant with another tokenizer cannot read the target's ids, so ids go through text: decode with
one tokenizer, encode with the other. Re-encoding a whole text every step would be slow and would
shift token boundaries near the join, so after the first round HF re-encodes only a short window
and finds where the window's tokens line up with the ids already known: the longest diagonal run of
equal tokens in the "window x known tail" match matrix (a longest-common-substring alignment).
Tokens of the window after that run are new; known tokens after it that the window disagrees with
are a discrepancy to patch.

The functions here reproduce HF's results id for id (including its quirks, noted where they
occur); they take the tokenizers as arguments and keep no state. ``UniversalAligner`` holds the two
values HF carries between rounds. Drafts are only proposals: whatever the alignment does, the target
verifies them, so it moves the acceptance rate, never the output.

Tokenizers are anything with HF's ``decode(ids, skip_special_tokens=..., clean_up_tokenization_spaces
=...)`` and ``__call__(text, add_special_tokens=...)["input_ids"]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

DEFAULT_LOOKBEHIND = 10  # HF's global default for both target_lookbehind and assistant_lookbehind


def retokenize(token_ids: Sequence[int], source_tokenizer: Any, destination_tokenizer: Any) -> list[int]:
    """HF's ``convert_source_tokens_to_target_tokens``: decode without special tokens, encode WITH
    them, so a destination tokenizer that adds a BOS (Gemma) puts one in front of every
    re-encoded window; the diagonal alignment later absorbs it. (transformers 5 ignores the
    ``clean_up_tokenization_spaces=True`` HF passes for BPE tokenizers, and logs a warning.)"""
    text = source_tokenizer.decode(list(token_ids), skip_special_tokens=True, clean_up_tokenization_spaces=True)
    return list(destination_tokenizer(text, add_special_tokens=True)["input_ids"])


MatchMatrix = torch.Tensor | Sequence[Sequence[bool]]  # [num_rows, num_cols]


def longest_diagonal_runs(match: MatchMatrix) -> dict[tuple[int, int], int]:
    """HF's ``_get_longest_diag_dict``: every maximal diagonal run of non-zero cells of ``match``
    (``[num_rows, num_cols]``), keyed by its start cell, in row-major order of the starts."""
    cells = match.tolist() if isinstance(match, torch.Tensor) else match
    num_rows = len(cells)
    num_cols = len(cells[0]) if num_rows else 0
    runs: dict[tuple[int, int], int] = {}
    for i in range(num_rows):
        for j in range(num_cols):
            if not cells[i][j] or (i > 0 and j > 0 and cells[i - 1][j - 1]):
                continue  # empty, or inside a run that starts earlier
            length = 1
            while i + length < num_rows and j + length < num_cols and cells[i + length][j + length]:
                length += 1
            runs[(i, j)] = length
    return runs


def longest_diagonal(match: MatchMatrix) -> tuple[tuple[int, int], int] | None:
    """HF's ``_get_longest_diag_index``: the start and length of the longest run; the first in
    row-major order on ties (``np.argmax``). None when ``match`` has no non-zero cell (HF fails)."""
    runs = longest_diagonal_runs(match)
    if not runs:
        return None
    start = max(runs, key=lambda cell: runs[cell])  # max keeps the first of equal keys, like argmax
    return start, runs[start]


@dataclass(frozen=True)
class TokenSplit:
    """HF's ``_get_tokens_diag`` result for one row.

    ``discrepancy_length``: known tokens after the aligned run (they disagree with the re-encoding);
    ``discrepancy_ids``: the re-encoding's tokens that replace them (may be shorter);
    ``new_ids``: the re-encoding's tokens beyond the known ones.
    """

    discrepancy_length: int
    new_ids: list[int]
    discrepancy_ids: list[int]


def split_tokens(known_ids: Sequence[int], reencoded_ids: Sequence[int]) -> TokenSplit | None:
    """HF's ``_get_tokens_diag(prompt, prompt_plus_new_tokens)``: align ``reencoded_ids`` (a
    re-encoding of the tail of ``known_ids`` plus new text) with ``known_ids`` by their longest
    diagonal run of equal tokens; None when they share no token at all."""
    known = list(known_ids)
    reencoded = list(reencoded_ids)
    match = [[a == b for b in known] for a in reencoded]  # [len(reencoded), len(known)]
    found = longest_diagonal(match)
    if found is None:
        return None
    (row, col), length = found
    new_start = row + length
    discrepancy_length = len(known) - (col + length)
    return TokenSplit(
        discrepancy_length=discrepancy_length,
        new_ids=reencoded[new_start + discrepancy_length :],
        discrepancy_ids=reencoded[new_start : new_start + discrepancy_length],
    )


@dataclass(frozen=True)
class AssistantInput:
    """The assistant's ids for a round. ``remove_from_pkv`` is HF's count of trailing positions the
    assistant must recompute; ``num_unchanged`` (Decoda's) is the common prefix with the previous
    round's assistant ids, i.e. how many cached positions stay valid (HF's crop can keep a patched
    position's stale K/V; this count cannot)."""

    token_ids: list[int]
    remove_from_pkv: int
    num_unchanged: int


def prepare_assistant_input_ids(
    target_ids: Sequence[int],
    target_tokenizer: Any,
    assistant_tokenizer: Any,
    prev_assistant_ids: Sequence[int] | None = None,
    prev_target_len: int | None = None,
    target_lookbehind: int = DEFAULT_LOOKBEHIND,
) -> AssistantInput:
    """HF's ``_prepare_assistant_input_ids``: the assistant's input for target ids ``target_ids``.

    First round (no ``prev_assistant_ids``), and every round while ``prev_target_len <=
    target_lookbehind``: the whole target text re-encoded. Later rounds: only
    ``target_ids[prev_target_len - target_lookbehind:]`` is re-encoded and aligned with the same
    number of trailing previous assistant ids (``split_tokens``); previous ids after the aligned run
    are patched, the new ones appended; with no common token at all the whole window is appended
    (HF's edge case, which duplicates text for the assistant).
    ``prev_assistant_ids``: last round's assistant input plus its drafts; ``prev_target_len``: the
    length of the target ids last round (before its drafts).
    """
    if prev_assistant_ids is None or prev_target_len is None or prev_target_len <= target_lookbehind:
        ids = retokenize(target_ids, target_tokenizer, assistant_tokenizer)
        previous = list(prev_assistant_ids or ())
        return AssistantInput(ids, 0, _common_prefix(previous, ids))
    previous = list(prev_assistant_ids)
    window = retokenize(target_ids[prev_target_len - target_lookbehind :], target_tokenizer, assistant_tokenizer)
    split = split_tokens(previous[-len(window) :], window)  # -0 → all, as in HF's tensor slice
    ids = list(previous)
    remove_from_pkv = 0
    if split is None:
        ids += window
    else:
        patch = split.discrepancy_ids
        if split.discrepancy_length > 0 and patch:
            if split.discrepancy_length > len(patch):  # the re-encoding merged tokens: drop the surplus
                ids = ids[: -(split.discrepancy_length - len(patch))]
            ids[-len(patch) :] = patch
            remove_from_pkv = split.discrepancy_length
        ids += split.new_ids
    return AssistantInput(ids, remove_from_pkv, _common_prefix(previous, ids))


def target_ids_from_assistant(
    target_ids: Sequence[int],
    assistant_sequence: Sequence[int],
    num_assistant_input: int,
    assistant_tokenizer: Any,
    target_tokenizer: Any,
    assistant_lookbehind: int = DEFAULT_LOOKBEHIND,
    max_length: int | None = None,
) -> list[int]:
    """HF's ``_process_assistant_outputs``: the target-token drafts for the assistant's output.

    ``assistant_sequence``: the assistant's input (``num_assistant_input`` ids) followed by its
    drafts. Its last ``num_assistant_input - assistant_lookbehind`` onwards is re-encoded for the
    target and aligned with as many trailing target ids; what follows the aligned run is the draft.
    HF quirk kept: when the assistant input is shorter than the lookbehind the start is negative and
    counts from the END of the sequence (a Python/torch negative slice), so the window may be drafts
    only. Returned: the drafts alone (HF returns ``target_ids + drafts``), clipped so the sequence
    stays within ``max_length`` (HF clips to ``max_length`` itself, not ``max_length - 1``; the drafts
    are not capped at ``num_assistant_tokens``).
    """
    start = num_assistant_input - assistant_lookbehind
    window = retokenize(list(assistant_sequence)[start:], assistant_tokenizer, target_tokenizer)
    known = list(target_ids)
    split = split_tokens(known[-len(window) :], window)
    drafts = window if split is None else split.new_ids  # no common token: HF appends the whole window
    if max_length is not None:
        drafts = drafts[: max(max_length - len(known), 0)]
    return list(drafts)


class UniversalAligner:
    """One request's alignment state, as HF's ``AssistedCandidateGeneratorDifferentTokenizers``
    carries it between rounds (``prev_assistant_ids``, ``prev_target_ids_len``).

    A round: ``assistant_input(target_ids)`` → run the assistant on ``.token_ids`` → ``drafts =
    target_drafts(target_ids, assistant_drafts)``. A round that drafts nothing (HF returns early
    when ``num_assistant_tokens`` is 0) simply calls neither.
    """

    def __init__(
        self,
        target_tokenizer: Any,
        assistant_tokenizer: Any,
        target_lookbehind: int = DEFAULT_LOOKBEHIND,
        assistant_lookbehind: int = DEFAULT_LOOKBEHIND,
    ) -> None:
        self.target_tokenizer = target_tokenizer
        self.assistant_tokenizer = assistant_tokenizer
        self.target_lookbehind = target_lookbehind
        self.assistant_lookbehind = assistant_lookbehind
        self.prev_target_len: int | None = None
        self.prev_assistant_ids: list[int] | None = None

    def assistant_input(self, target_ids: Sequence[int]) -> AssistantInput:
        first = (
            self.prev_assistant_ids is None
            or self.prev_target_len is None
            or self.prev_target_len <= self.target_lookbehind
        )
        result = prepare_assistant_input_ids(
            target_ids,
            self.target_tokenizer,
            self.assistant_tokenizer,
            self.prev_assistant_ids,
            self.prev_target_len,
            self.target_lookbehind,
        )
        if first:
            self.prev_target_len = len(target_ids)
        self.prev_assistant_ids = result.token_ids
        return result

    def target_drafts(
        self, target_ids: Sequence[int], assistant_drafts: Sequence[int], max_length: int | None = None
    ) -> list[int]:
        """Target-token drafts for the assistant's drafts after the last ``assistant_input``."""
        if self.prev_assistant_ids is None:
            raise RuntimeError("assistant_input() must come first")
        num_input = len(self.prev_assistant_ids)
        sequence = self.prev_assistant_ids + list(assistant_drafts)
        drafts = target_ids_from_assistant(
            target_ids,
            sequence,
            num_input,
            self.assistant_tokenizer,
            self.target_tokenizer,
            self.assistant_lookbehind,
            max_length,
        )
        self.prev_target_len = len(target_ids)
        self.prev_assistant_ids = sequence
        return drafts


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
