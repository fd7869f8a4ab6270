"""Every row's logits knobs applied batched, in transformers' order, then greedy or sampled picks.

``SamplingBatch.from_rows`` turns the per-row ``GenerationParams`` of the current batch into
per-knob row indices and parameter tensors (built once per batch composition). ``process`` then
applies each knob as one tensor op over exactly the rows that have it, so rows without the knob
are bit-for-bit untouched, matching HF applying its processor only when the knob is set.

Order (``GenerationMixin._get_logits_processor``): OpenAI ``logit_bias`` (where HF puts
``sequence_bias``), ``repetition_penalty``, OpenAI presence/frequency penalties (right after
HF's own repetition penalty, as vLLM applies them before temperature), ``no_repeat_ngram_size``,
``bad_words_ids``, ``min_new_tokens``, a structured output's grammar mask (``sampling/grammar.py``),
``suppress_tokens``, a thinking budget's forced end tag (``sampling/thinking.py``, over every processor
before it); then, for sampling rows only,
temperature, top_k, top_p, min_p, typical_p, epsilon_cutoff, eta_cutoff with
``min_tokens_to_keep=1``. Greedy rows get the processors but no warpers, like HF greedy search.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from decoding.sampling.fast_argmax import argmax_rows
from decoding.sampling.finite import NonFiniteScores, unpickable, unpickable_picks
from decoding.sampling.grammar import apply_grammar_masks
from decoding.sampling.length_rules import LengthKnobs
from decoding.sampling.nucleus import top_p
from decoding.sampling.row_state import RowSamplingState
from decoding.sampling.thinking import force_thinking_ends
from decoding.sampling.watermark import WatermarkProcessor
from decoding.sampling.whisper_rules import apply_whisper_rules

NEG_INF = float("-inf")


@dataclass
class _Knob:
    rows: torch.Tensor  # [num_knob_rows] indices into the batch
    values: torch.Tensor  # [num_knob_rows, 1] the knob's per-row parameter


def _knob(rows: list[RowSamplingState], value_of, keep, device: torch.device) -> _Knob | None:  # noqa: ANN001
    picked = [(i, value_of(r)) for i, r in enumerate(rows) if keep(r)]
    if not picked:
        return None
    index = torch.tensor([i for i, _ in picked], dtype=torch.long, device=device)
    values = torch.tensor([v for _, v in picked], dtype=torch.float32, device=device).unsqueeze(1)
    return _Knob(index, values)


def _pairs(per_row: list[tuple[int, torch.Tensor]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(rows, tokens)`` index tensors of each row's token tensor, or None when no row has one."""
    if not per_row:
        return None
    rows = torch.cat([torch.full_like(tokens, i) for i, tokens in per_row])
    return rows.to(device), torch.cat([tokens for _, tokens in per_row]).to(device)


class SamplingBatch:
    def __init__(self, rows: list[RowSamplingState], device: torch.device, min_tokens_to_keep: int = 1) -> None:
        self.rows = rows
        self.device = device
        # beam sampling keeps num_eos + 1 tokens through every warper, as HF does for num_beams > 1
        self.min_tokens_to_keep = min_tokens_to_keep
        sampling = [r.params.do_sample for r in rows]
        self.sample_rows = [i for i, s in enumerate(sampling) if s]
        self.greedy_rows = [i for i, s in enumerate(sampling) if not s]

        def sampled(predicate):  # noqa: ANN001, ANN202
            return lambda r: r.params.do_sample and predicate(r.params)

        self.repetition = _knob(rows, lambda r: r.params.repetition_penalty, lambda r: r.seen is not None, device)
        self.presence_frequency = [i for i, r in enumerate(rows) if r.counts is not None]
        if self.presence_frequency:
            penalized = [rows[i].params for i in self.presence_frequency]
            self._pf_index = torch.tensor(self.presence_frequency, dtype=torch.long, device=device)
            self._presence = torch.tensor([p.presence_penalty for p in penalized], device=device)  # [n]
            self._frequency = torch.tensor([p.frequency_penalty for p in penalized], device=device)  # [n]
        self.temperature = _knob(rows, lambda r: r.params.temperature, sampled(lambda p: p.temperature != 1.0), device)
        self.top_k = _knob(rows, lambda r: r.params.top_k, sampled(lambda p: bool(p.top_k)), device)
        # 1 - top_p in double precision first, rounded once, exactly as HF's Python-float threshold
        self.top_p = _knob(rows, lambda r: 1 - r.params.top_p, sampled(lambda p: p.top_p < 1.0), device)
        self.min_p = _knob(rows, lambda r: r.params.min_p, sampled(lambda p: p.min_p is not None), device)
        self.typical_p = _knob(rows, lambda r: r.params.typical_p, sampled(lambda p: p.typical_p < 1.0), device)
        self.epsilon = _knob(
            rows, lambda r: r.params.epsilon_cutoff, sampled(lambda p: 0.0 < p.epsilon_cutoff < 1.0), device
        )
        self.eta = _knob(rows, lambda r: r.params.eta_cutoff, sampled(lambda p: 0.0 < p.eta_cutoff < 1.0), device)
        # static bans and biases: (row, token) pairs fixed for the request's life, as tensors built
        # once per request (sampling/token_rules.py), so a long list costs nothing here per step
        biased = [(i, r.rules.logit_bias) for i, r in enumerate(rows) if r.rules and r.rules.logit_bias is not None]
        self.bias = _pairs([(i, tokens) for i, (tokens, _) in biased], device)
        if self.bias is not None:
            self.bias = (*self.bias, torch.cat([values for _, (_, values) in biased]))
        self.suppress = _pairs([(i, r.rules.suppress) for i, r in enumerate(rows)
                                if r.rules and r.rules.suppress is not None], device)  # fmt: skip
        self.history_rows = [
            i for i, r in enumerate(rows) if r.ngrams is not None or r.params.bad_words_ids or r.params.min_new_tokens
        ]
        self.needs_processing = any(
            x is not None
            for x in (self.repetition, self.temperature, self.top_k, self.top_p, self.min_p, self.typical_p)
            + (self.epsilon, self.eta, self.bias, self.suppress)
        ) or bool(self.presence_frequency or self.history_rows)
        self.length_knobs = LengthKnobs(rows, device)
        self.needs_processing = self.needs_processing or self.length_knobs.active
        marked = [(i, r) for i, r in enumerate(rows) if r.params.watermarking_config is not None]
        self.watermark = WatermarkProcessor(marked, rows[0].vocab_size) if marked else None
        self.needs_processing = self.needs_processing or self.watermark is not None
        self.grammar_rows = [i for i, r in enumerate(rows) if r.grammar is not None]
        self.needs_processing = self.needs_processing or bool(self.grammar_rows)
        self.thinking_rows = [i for i, r in enumerate(rows) if r.thinking is not None]
        self.needs_processing = self.needs_processing or bool(self.thinking_rows)
        self.whisper_rows = [i for i, r in enumerate(rows) if r.params.whisper is not None]
        self.needs_processing = self.needs_processing or bool(self.whisper_rows)

    @classmethod
    def from_rows(
        cls, rows: list[RowSamplingState], device: torch.device | str = "cpu", min_tokens_to_keep: int = 1
    ) -> SamplingBatch:
        return cls(rows, torch.device(device), min_tokens_to_keep)

    @classmethod
    def for_row(cls, row: RowSamplingState) -> SamplingBatch:
        """A batch of ``row`` alone, built once and kept on the row: a strategy that processes one
        row's several positions itself (drafts, a verification, contrastive candidates) reuses it."""
        if row.alone is None:
            row.alone = cls([row], row.device)
        return row.alone

    # ---- processing ---------------------------------------------------------------------------------
    def process(self, logits: torch.Tensor, diversity_penalty: torch.Tensor | None = None) -> torch.Tensor:
        """``logits``: ``[num_rows, vocab_size]`` float32 raw logits; returns processed scores.

        ``diversity_penalty`` (``[vocab_size]``, diverse beam search) is subtracted from every row
        right after the logit bias, where HF's ``HammingDiversityLogitsProcessor`` sits.
        """
        if not self.needs_processing and diversity_penalty is None:
            return logits
        scores = logits.clone()
        # sequence_bias (HF: first; classifier-free guidance, before it in HF, is mixed by its
        # strategy before the logits reach this batch: strategies/guidance.py)
        self.length_knobs.apply_sequence_bias(scores)
        if self.bias is not None:
            rows, tokens, values = self.bias
            scores.index_put_((rows, tokens), values.to(scores.dtype), accumulate=True)
        if diversity_penalty is not None:
            scores -= diversity_penalty
        if self.repetition is not None:
            self._apply(scores, self.repetition, self._repetition_penalty)
        if self.presence_frequency:
            counts = torch.stack([self.rows[i].counts for i in self.presence_frequency])  # [n, vocab_size]
            scores[self._pf_index] -= self._frequency[:, None] * counts + self._presence[:, None] * (counts > 0)
        if self.history_rows:
            self._history_bans(scores)
        # structured outputs: where HF's PrefixConstrainedLogitsProcessor sits (after the bans above,
        # before forced BOS/EOS and the warpers; every ban is -inf, so their order among them is moot)
        if self.grammar_rows:
            apply_grammar_masks(scores, self.grammar_rows, [self.rows[i].grammar for i in self.grammar_rows])
        # forced_bos/forced_eos, exponential_decay_length_penalty (HF: before suppress_tokens)
        # min_length sits with them: HF puts it between bad_words_ids and min_new_tokens, all -inf bans
        self.length_knobs.apply_length_rules(scores)
        if self.suppress is not None:
            scores[self.suppress] = NEG_INF
        # begin_suppress_tokens (HF: right after suppress_tokens)
        self.length_knobs.apply_begin_suppress(scores)
        # a thinking budget spent: its end tag, over every processor above (sampling/thinking.py)
        if self.thinking_rows:
            force_thinking_ends(scores, self.thinking_rows, [self.rows[i].thinking for i in self.thinking_rows])
        for knob, op in (
            (self.temperature, _temperature),
            (self.top_k, _top_k),
            (self.top_p, top_p),
            (self.min_p, _min_p),
            (self.typical_p, _typical_p),
            (self.epsilon, _epsilon),
            (self.eta, _eta),
        ):
            if knob is not None:
                scores[knob.rows] = op(scores[knob.rows], knob.values, self.min_tokens_to_keep)
        # Whisper's suppressions and timestamp rules: after the warpers, as its generate() appends them
        if self.whisper_rows:
            rows = [self.rows[i] for i in self.whisper_rows]
            apply_whisper_rules(scores, self.whisper_rows, [r.history for r in rows], [r.params.whisper for r in rows])
        # WatermarkLogitsProcessor (HF 5: after the processors and the warpers, before
        # LogitNormalization; see _get_logits_processor, transformers#34630)
        if self.watermark is not None:
            scores = self.watermark.apply(scores)
        # renormalize_logits (HF: LogitNormalization, last)
        self.length_knobs.apply_renormalize(scores)
        return scores

    @staticmethod
    def _apply(scores: torch.Tensor, knob: _Knob, op) -> None:  # noqa: ANN001
        scores[knob.rows] = op(scores[knob.rows], knob.values)

    def _repetition_penalty(self, scores: torch.Tensor, penalty: torch.Tensor) -> torch.Tensor:
        # HF RepetitionPenaltyLogitsProcessor: every token present in input_ids, once
        seen = torch.stack([self.rows[i].seen for i in self.repetition.rows.tolist()])  # [n, vocab_size]
        penalized = torch.where(scores < 0, scores * penalty, scores / penalty)
        return torch.where(seen, penalized, scores)

    def _history_bans(self, scores: torch.Tensor) -> None:
        rows, tokens = [], []
        for i in self.history_rows:
            row = self.rows[i]
            banned = row.banned_ngram_tokens() | row.banned_bad_words()
            if row.num_generated < row.params.min_new_tokens:  # HF MinNewTokensLengthLogitsProcessor
                banned.update(row.eos_token_ids)
            rows.extend([i] * len(banned))
            tokens.extend(banned)
        if rows:
            device = scores.device
            scores[torch.tensor(rows, device=device), torch.tensor(tokens, device=device)] = NEG_INF

    # ---- picking ------------------------------------------------------------------------------------
    def sample(self, scores: torch.Tensor) -> list[int]:
        """Greedy rows: argmax. Sampling rows: one multinomial draw with the row's own generator. Every
        row is checked before any draw (``finite``): rows no token can be picked from raise
        ``NonFiniteScores`` naming them, with every generator untouched."""
        tokens = [0] * len(self.rows)
        bad: list[int] = []
        if self.greedy_rows:
            greedy = scores if len(self.greedy_rows) == len(self.rows) else scores[self.greedy_rows]
            picked = argmax_rows(greedy)
            bad += [self.greedy_rows[j] for j in unpickable_picks(greedy, picked)]
            for i, token in zip(self.greedy_rows, picked.tolist(), strict=True):
                tokens[i] = token
        probs = None
        if self.sample_rows:
            probs = torch.softmax(scores[self.sample_rows], dim=-1)  # [num_sample_rows, vocab_size]
            bad += [self.sample_rows[j] for j in unpickable(probs)]
        if bad:
            raise NonFiniteScores(sorted(bad))
        for j, i in enumerate(self.sample_rows):
            try:
                draw = torch.multinomial(probs[j : j + 1], num_samples=1, generator=self.rows[i].generator)
            except RuntimeError:
                if bool(torch.isfinite(probs[j]).all()):
                    raise
                raise NonFiniteScores([i]) from None  # an inf or a negative the check above cannot see
            tokens[i] = int(draw)
        return tokens


# ---- warpers (HF's math, per-row parameters as [n, 1] tensors) -----------------------------------------
def _temperature(scores: torch.Tensor, temperature: torch.Tensor, keep: int = 1) -> torch.Tensor:
    return scores / temperature  # TemperatureLogitsWarper


def _top_k(scores: torch.Tensor, top_k: torch.Tensor, keep: int = 1) -> torch.Tensor:
    # TopKLogitsWarper: drop scores below the k-th largest
    k = top_k.long().clamp(min=keep, max=scores.shape[-1])  # [n, 1]
    largest = torch.topk(scores, int(k.max()), dim=-1).values  # sorted; far cheaper than a full sort
    kth = largest.gather(-1, k - 1)
    return scores.masked_fill(scores < kth, NEG_INF)


def _min_p(scores: torch.Tensor, min_p: torch.Tensor, keep: int = 1) -> torch.Tensor:
    # MinPLogitsWarper
    probs = torch.softmax(scores, dim=-1)
    remove = probs < min_p * probs.amax(dim=-1, keepdim=True)
    remove.scatter_(-1, torch.topk(probs, min(keep, probs.shape[-1]), dim=-1).indices, False)
    return scores.masked_fill(remove, NEG_INF)


def _typical_p(scores: torch.Tensor, mass: torch.Tensor, keep: int = 1) -> torch.Tensor:
    # TypicalLogitsWarper
    normalized = torch.log_softmax(scores, dim=-1)
    p = torch.exp(normalized)
    entropy = -(normalized * p).nansum(-1, keepdim=True)
    shifted = torch.abs((-normalized) - entropy)
    sorted_scores, sorted_indices = torch.sort(shifted, descending=False)
    cumulative = scores.gather(-1, sorted_indices).softmax(dim=-1).cumsum(dim=-1)
    last = (cumulative < mass).sum(dim=1).clamp_(max=sorted_scores.shape[-1] - 1)
    remove = sorted_scores > sorted_scores.gather(1, last.view(-1, 1))
    remove[..., :keep] = False
    remove = remove.scatter(1, sorted_indices, remove)
    return scores.masked_fill(remove, NEG_INF)


def _keep_top(scores: torch.Tensor, remove: torch.Tensor, keep: int) -> torch.Tensor:
    return remove & (scores < torch.topk(scores, min(keep, scores.shape[-1]))[0][..., -1, None])


def _epsilon(scores: torch.Tensor, epsilon: torch.Tensor, keep: int = 1) -> torch.Tensor:
    # EpsilonLogitsWarper
    remove = _keep_top(scores, scores.softmax(dim=-1) < epsilon, keep)
    return scores.masked_fill(remove, NEG_INF)


def _eta(scores: torch.Tensor, epsilon: torch.Tensor, keep: int = 1) -> torch.Tensor:
    # EtaLogitsWarper: eta = min(epsilon, sqrt(epsilon) * exp(-entropy))
    # HF's Categorical entropy; unvalidated, so a NaN row reaches the pick's check instead of raising here
    entropy = torch.distributions.Categorical(logits=scores, validate_args=False).entropy()[:, None]
    eta = torch.minimum(epsilon, torch.sqrt(epsilon) * torch.exp(-entropy))
    remove = _keep_top(scores, scores.softmax(dim=-1) < eta, keep)
    return scores.masked_fill(remove, NEG_INF)
