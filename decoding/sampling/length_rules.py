"""Batched versions of HF's processors for the knobs that depend on a row's length or bias whole
token sequences: each knob is one tensor op over exactly the rows that set it.

HF classes matched, in ``GenerationMixin._get_logits_processor``'s order (``SamplingBatch.process``
calls each method at the matching place): ``SequenceBiasLogitsProcessor`` (``sequence_bias``,
right after guidance), ``MinLengthLogitsProcessor`` (``min_length``), ``ForcedBOSTokenLogitsProcessor``,
``ForcedEOSTokenLogitsProcessor``, ``ExponentialDecayLengthPenalty`` (all before
``suppress_tokens``), ``SuppressTokensAtBeginLogitsProcessor`` (right after it) and
``LogitNormalization`` (``renormalize_logits``, last, after the warpers).

HF reads lengths from ``input_ids`` (prompt + generated); a row's ``history`` is exactly that, and
its prompt length is ``len(history) - num_generated``, fixed for the row's life, so everything
static is built once per batch composition and only "which rows fire now" is decided per step.
One divergence: ``forced_eos_token_id`` fires one token before HF's ``max_length`` (the prompt plus
``max_new_tokens``, or the request's ``max_length``); when the context is shorter than that, the
row ends at the context limit first and the knob never fires, where HF would run past the model.
"""

from __future__ import annotations

import math

import torch

from decoding.params.lengths import forced_eos_ids, new_token_limit
from decoding.sampling.row_state import RowSamplingState

NEG_INF = float("-inf")


def _prompt_len(row: RowSamplingState) -> int:
    return len(row.history) - row.num_generated


def _power(factor: float, exponent: int) -> float:
    try:
        return math.pow(factor, exponent)
    except OverflowError:  # HF's pow() raises here; a growing penalty's limit is inf
        return math.inf


class LengthKnobs:
    """The per-row parameters of these knobs for one batch of rows; ``active`` if any row sets one."""

    def __init__(self, rows: list[RowSamplingState], device: torch.device) -> None:
        self.rows = rows
        self.device = device
        self.sequence_bias = [i for i, r in enumerate(rows) if r.params.sequence_bias]
        self.min_length = [i for i, r in enumerate(rows) if r.params.min_length > 0]
        self.forced_bos = [i for i, r in enumerate(rows) if r.params.forced_bos_token_id is not None]
        self.forced_eos = [i for i, r in enumerate(rows) if r.params.forced_eos_token_id is not None]
        self._max_length = {i: _prompt_len(rows[i]) + new_token_limit(rows[i].params, _prompt_len(rows[i]))
                            for i in self.forced_eos}  # fmt: skip
        self.decay = [i for i, r in enumerate(rows) if r.params.exponential_decay_length_penalty is not None]
        self.begin_suppress = [i for i, r in enumerate(rows) if r.params.begin_suppress_tokens]
        self._begin_index = {i: self._suppress_begin(rows[i]) for i in self.begin_suppress}
        self.renormalize = [i for i, r in enumerate(rows) if r.params.renormalize_logits]
        self._renormalize = self._ids(self.renormalize)
        self.active = bool(
            self.sequence_bias or self.min_length or self.forced_bos or self.forced_eos or self.decay
            or self.begin_suppress or self.renormalize
        )  # fmt: skip

    def _ids(self, values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=self.device)

    @staticmethod
    def _suppress_begin(row: RowSamplingState) -> int:
        # HF: begin_index = prompt length, + 1 when a forced BOS takes the first step of a 1-token prompt
        prompt_len = _prompt_len(row)
        return prompt_len + (1 if prompt_len == 1 and row.params.forced_bos_token_id is not None else 0)

    # ---- sequence_bias (SequenceBiasLogitsProcessor) -------------------------------------------------
    def apply_sequence_bias(self, scores: torch.Tensor) -> None:
        """Adds each row's biases: one-token sequences always, longer ones on their last token when
        the history ends with the rest (the prefix must fit in the history), as HF does: float32 biases
        summed in HF's order (``TokenRules.sequence_bias_entries``), then added to the scores, as HF's
        ``scores + bias``; HF's bias is 0 at every other token, so only the entries are added."""
        if not self.sequence_bias:
            return
        rows, tokens, values = [], [], []
        for i in self.sequence_bias:
            row_tokens, row_values = self.rows[i].rules.sequence_bias_entries(self.rows[i].history)
            rows.extend([i] * len(row_tokens))
            tokens.extend(row_tokens)
            values.append(row_values)
        if not tokens:
            return
        index = (self._ids(rows), self._ids(tokens))
        scores[index] = scores[index] + torch.cat(values).to(device=scores.device, dtype=scores.dtype)

    # ---- min_length, forced_bos/eos, exponential decay (HF's order, before suppress_tokens) ------------
    def apply_length_rules(self, scores: torch.Tensor) -> None:
        rows, tokens = [], []
        for i in self.min_length:  # MinLengthLogitsProcessor: no eos before min_length (prompt included)
            row = self.rows[i]
            if len(row.history) < row.params.min_length:
                rows.extend([i] * len(row.eos_token_ids))
                tokens.extend(row.eos_token_ids)
        if rows:
            scores[self._ids(rows), self._ids(tokens)] = NEG_INF
        forced = [(i, [self.rows[i].params.forced_bos_token_id]) for i in self.forced_bos
                  if len(self.rows[i].history) == 1]  # fmt: skip
        self._force(scores, forced)  # ForcedBOSTokenLogitsProcessor: only when input_ids is one token long
        forced = [(i, forced_eos_ids(self.rows[i].params)) for i in self.forced_eos
                  if len(self.rows[i].history) == self._max_length[i] - 1]  # fmt: skip
        self._force(scores, forced)  # ForcedEOSTokenLogitsProcessor: the step before max_length
        if self.decay:
            self._decay(scores)

    def _force(self, scores: torch.Tensor, forced: list[tuple[int, list[int]]]) -> None:
        """Every score of these rows to -inf except their forced tokens, which become 0."""
        if not forced:
            return
        scores[self._ids([i for i, _ in forced])] = NEG_INF
        rows = [i for i, ids in forced for _ in ids]
        scores[self._ids(rows), self._ids([t for _, ids in forced for t in ids])] = 0.0

    def _decay(self, scores: torch.Tensor) -> None:
        """ExponentialDecayLengthPenalty: past start_index new tokens, eos scores grow by
        ``|score| * (decay_factor ** steps_past_start - 1)``; non-finite scores stay as they are."""
        rows, tokens, factors = [], [], []
        for i in self.decay:
            row = self.rows[i]
            start, factor = row.params.exponential_decay_length_penalty
            past = len(row.history) - (start + _prompt_len(row))
            if past > 0:
                rows.extend([i] * len(row.eos_token_ids))
                tokens.extend(row.eos_token_ids)
                factors.extend([_power(factor, past) - 1] * len(row.eos_token_ids))
        if not rows:
            return
        index = (self._ids(rows), self._ids(tokens))
        eos_scores = scores[index]  # [num_pairs]
        factor = torch.tensor(factors, dtype=scores.dtype, device=self.device)
        penalty = (eos_scores.abs() * factor).masked_fill(~torch.isfinite(eos_scores), 0.0)
        scores[index] = eos_scores + penalty

    # ---- begin_suppress_tokens (SuppressTokensAtBeginLogitsProcessor) -----------------------------------
    def apply_begin_suppress(self, scores: torch.Tensor) -> None:
        for i in self.begin_suppress:
            row = self.rows[i]
            if len(row.history) == self._begin_index[i]:
                scores[i, row.rules.begin_suppress] = NEG_INF

    # ---- renormalize_logits (LogitNormalization) ----------------------------------------------------
    def apply_renormalize(self, scores: torch.Tensor) -> None:
        if self.renormalize:
            scores[self._renormalize] = scores[self._renormalize].log_softmax(dim=-1)
