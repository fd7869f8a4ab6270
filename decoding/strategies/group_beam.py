"""Diverse (group) beam search for one request: transformers 4.x's ``_group_beam_search``.

Vijayakumar et al. 2016, "Diverse Beam Search". The ``num_beams`` beams are split into
``num_beam_groups`` groups searched one after another within each step; a group's scores are
lowered by ``diversity_penalty`` times how often each token was just chosen by the earlier groups
(HF's ``HammingDiversityLogitsProcessor``). transformers 5 moved this method out of its core, so
the reference is 4.x: its ``BeamSearchScorer`` keeps, per group, a list of at most ``group_size``
finished hypotheses (``BeamHypotheses``) with a worst-score bar, adds a hypothesis when a top-
``group_size`` candidate ends in eos (stored without the eos, scored with it counted in the
length), and finalises by adding the running beams of groups not yet done, then returning the best
hypotheses over all groups. That bookkeeping is reproduced here in Python floats, as HF does it,
so tokens and scores match; the model-facing part (one forward for all beams) is the engine's.

Where 4.x differs from the 5.x vectorised beam search used for plain beams: ``early_stopping``
is judged per group by ``BeamHypotheses.is_done``; a finished group keeps feeding pad tokens
(which still count in later groups' diversity penalty) until every group is done.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from decoding.outputs import TokenLogprob
from decoding.params import GenerationParams
from decoding.sampling import RowSamplingState, SamplingBatch
from decoding.sampling.finite import NonFiniteScores, unpickable
from decoding.strategies.beam import NEG, BeamStep, FinalSequence, Hypothesis, continue_states
from decoding.strategies.beam_rows import BeamRows


class _FinishedHypotheses:
    """HF 4.x ``BeamHypotheses``: the n-best finished sequences of one group."""

    def __init__(self, size: int, length_penalty: float, early_stopping: bool | str, max_new_tokens: int) -> None:
        self.size = size
        self.length_penalty = length_penalty
        self.early_stopping = early_stopping
        self.max_new_tokens = max_new_tokens
        self.beams: list[tuple[float, Hypothesis, bool]] = []  # (score, hypothesis, ended by a stop)
        self.worst_score = 1e9

    def add(self, hypothesis: Hypothesis, sum_logprobs: float, generated_len: int, stopped: bool) -> None:
        score = sum_logprobs / (generated_len**self.length_penalty)
        if len(self.beams) < self.size or score > self.worst_score:
            self.beams.append((score, hypothesis, stopped))
            if len(self.beams) > self.size:
                ranked = sorted((s, i) for i, (s, _, _) in enumerate(self.beams))
                del self.beams[ranked[0][1]]
                self.worst_score = ranked[1][0]
            else:
                self.worst_score = min(score, self.worst_score)

    def is_done(self, best_sum_logprobs: float, generated_len: int) -> bool:
        if len(self.beams) < self.size:
            return False
        if self.early_stopping is True:
            return True
        length = generated_len
        if self.early_stopping == "never" and self.length_penalty > 0.0:
            length = self.max_new_tokens
        return self.worst_score >= best_sum_logprobs / length**self.length_penalty


class GroupBeamSearch:
    def __init__(
        self,
        params: GenerationParams,
        prompt_ids: list[int],
        eos_token_ids: list[int],
        pad_token_id: int,
        vocab_size: int,
        max_new_tokens: int,
        stops: Callable[[list[int]], bool],
        token_logprob: Callable[[torch.Tensor, int], TokenLogprob] | None = None,
        device: torch.device | str = "cpu",
    ) -> None:
        self.params = params
        self.device = device = torch.device(device)
        self.num_beams = params.num_beams
        self.num_groups = params.num_beam_groups
        self.group_size = self.num_beams // self.num_groups
        self.eos = set() if params.ignore_eos else set(eos_token_ids)
        self.pad_token_id = pad_token_id
        self.vocab_size = vocab_size
        self.max_new_tokens = max_new_tokens
        self.stops = stops
        self.token_logprob = token_logprob
        self.candidates_per_group = max(2, 1 + len(self.eos)) * self.group_size
        state = RowSamplingState(params, prompt_ids, list(eos_token_ids), vocab_size, None, device)
        self.states = [state] + [state.fork() for _ in range(self.num_beams - 1)]
        self.running = [Hypothesis([]) for _ in range(self.num_beams)]
        self.scores = torch.full((self.num_beams,), NEG, device=device)
        self.scores[:: self.group_size] = 0  # the first beam of every group starts
        self.finished = [
            _FinishedHypotheses(self.group_size, params.length_penalty, params.early_stopping, max_new_tokens)
            for _ in range(self.num_groups)
        ]
        self.group_done = [False] * self.num_groups
        self.num_generated = 0

    # ---- one step ------------------------------------------------------------------------------------
    def step(self, logits: torch.Tensor) -> BeamStep:
        """``logits``: ``[num_beams, vocab_size]`` raw float32 logits of the running beams."""
        size = self.group_size
        current_tokens = torch.zeros(self.num_beams, dtype=torch.long, device=self.device)
        parents: list[int] = [0] * self.num_beams
        new_running: list[Hypothesis] = [Hypothesis([])] * self.num_beams
        new_scores = self.scores.clone()
        for group in range(self.num_groups):
            start = group * size
            members = range(start, start + size)
            if self.group_done[group]:  # HF keeps a finished group alive with pad tokens, score 0
                chosen = [(0.0, start, self.pad_token_id)] * size
            else:
                chosen = self._search_group(group, logits[start : start + size], current_tokens)
            for j, (score, parent, token) in zip(members, chosen, strict=True):
                parents[j] = parent
                new_scores[j] = score
                current_tokens[j] = token
                new_running[j] = self.running[parent].extend(token, logits[parent], self.token_logprob)
        tokens = current_tokens.tolist()
        self.states = continue_states(self.states, parents, tokens)
        self.running, self.scores = new_running, new_scores
        self.num_generated += 1
        done = all(self.group_done) or self.num_generated >= self.max_new_tokens
        if done:
            self._finalize()
        return BeamStep(parents, tokens, done)

    def _search_group(
        self, group: int, logits: torch.Tensor, current_tokens: torch.Tensor
    ) -> list[tuple[float, int, int]]:
        """One group's beam step (HF 4.x ``BeamSearchScorer.process``): (score, parent, token) per beam."""
        size = self.group_size
        start = group * size
        log_probs = torch.log_softmax(logits, dim=-1)  # [group_size, vocab_size]
        penalty = None
        if group > 0 and self.params.diversity_penalty > 0:
            frequency = torch.bincount(current_tokens[:start], minlength=self.vocab_size)
            penalty = self.params.diversity_penalty * frequency
        batch = SamplingBatch(self.states[start : start + size], logits.device)
        processed = batch.process(log_probs, diversity_penalty=penalty)
        bad = unpickable(processed)  # a beam with NaN or all -inf scores: the request fails (400), not the step
        if bad:
            raise NonFiniteScores(bad)
        totals = (processed + self.scores[start : start + size, None]).view(1, -1)
        top_scores, top_ids = torch.topk(totals, self.candidates_per_group, dim=1, largest=True, sorted=True)
        vocab_size = logits.shape[-1]
        chosen: list[tuple[float, int, int]] = []
        generated_len = self.num_generated + 1
        for rank, (score, flat) in enumerate(zip(top_scores[0].tolist(), top_ids[0].tolist(), strict=True)):
            parent, token = start + flat // vocab_size, flat % vocab_size
            candidate_ids = [*self.running[parent].token_ids, token]
            ends = token in self.eos or self.stops(candidate_ids)
            if ends:
                if rank >= size:
                    continue
                hypothesis = self.running[parent].extend(token, logits[parent - start], self.token_logprob)
                self.finished[group].add(hypothesis, score, generated_len, stopped=True)
            else:
                chosen.append((score, parent, token))
            if len(chosen) == size:
                break
        best = float(top_scores[0, 0])
        self.group_done[group] = self.group_done[group] or self.finished[group].is_done(best, generated_len)
        return chosen

    # ---- the end ----------------------------------------------------------------------------------------
    def _finalize(self) -> None:
        """HF 4.x ``finalize``: running beams of groups not done join their group's hypotheses."""
        for group in range(self.num_groups):
            if self.group_done[group]:
                continue
            for j in range(group * self.group_size, (group + 1) * self.group_size):
                self.finished[group].add(self.running[j], float(self.scores[j]), self.num_generated, stopped=False)
            self.group_done[group] = True

    def finish_now(self) -> None:
        if self.num_generated:
            self._finalize()

    def results(self, count: int) -> list[FinalSequence]:
        ranked = sorted((beam for group in self.finished for beam in group.beams), key=lambda beam: beam[0])
        out = []
        for _ in range(min(count, len(ranked))):
            score, hypothesis, stopped = ranked.pop()
            out.append(FinalSequence(list(hypothesis.token_ids), score, list(hypothesis.logprobs), stopped))
        return out


class GroupBeamDecoding(BeamRows):
    """Diverse beam search (``num_beam_groups > 1``), transformers 4.x's ``_group_beam_search``."""

    def make_search(self) -> GroupBeamSearch:
        request, ctx = self.request, self.ctx
        return GroupBeamSearch(
            request.params,
            request.text_ids,
            ctx.eos_token_ids,
            ctx.pad_token_id,
            ctx.vocab_size,
            self.max_new_tokens,
            self.ends,
            self.logprob_fn(),
            ctx.device,
        )
