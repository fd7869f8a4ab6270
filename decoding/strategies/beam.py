"""Beam search and beam sampling for one request: transformers 5's ``_beam_search`` step by step.

The model is never called here. Each step the engine hands over the logits of the request's
``num_beams`` rows (all computed in the shared batched forward); ``step()`` returns which parent
beam every new beam continues and its token, so ``BeamRows`` can move KV slots. The arithmetic
mirrors HF's vectorised implementation operation for operation on ``[1, num_beams * vocab]``
tensors (top-K with K = max(2, 1 + num_eos) * num_beams candidates, ``-1e9`` masks, the
length-penalised merge of finished hypotheses, and the ``early_stopping`` heuristic), because
float32 rounding and ``torch.topk`` tie order must match for the tokens and scores to be equal.

``early_stopping``, as in HF:
- ``True``: stop as soon as ``num_beams`` finished hypotheses exist.
- ``False``: stop when the best running beam, length-normalised at the current length, cannot
  beat the worst finished hypothesis.
- ``"never"``: like False, but with a positive length penalty the best running beam is assumed
  to reach ``max_new_tokens`` (the canonical, exhaustive rule).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from decoding.outputs import TokenLogprob
from decoding.params import GenerationParams
from decoding.sampling import RowSamplingState, SamplingBatch
from decoding.sampling.finite import NonFiniteScores, unpickable
from decoding.strategies.beam_rows import BeamRows

NEG = -1.0e9  # HF's "impossible" score; finite so sums stay ordered


@dataclass
class Hypothesis:
    token_ids: list[int]
    logprobs: list[TokenLogprob] = field(default_factory=list)  # raw logprobs, only when asked

    def extend(
        self, token: int, logits: torch.Tensor, token_logprob: Callable[[torch.Tensor, int], TokenLogprob] | None
    ) -> Hypothesis:
        """This hypothesis plus ``token``; ``logits`` are the step's (for the logprob, when asked)."""
        logprobs = self.logprobs if token_logprob is None else [*self.logprobs, token_logprob(logits, token)]
        return Hypothesis([*self.token_ids, token], logprobs)


@dataclass
class BeamStep:
    """What ``BeamRows`` must do after one step: KV moves, and whether the search is over."""

    parents: list[int]  # new beam j continues old beam parents[j]
    tokens: list[int]  # and feeds tokens[j] next
    done: bool


@dataclass
class FinalSequence:
    token_ids: list[int]
    score: float
    logprobs: list[TokenLogprob]
    hit_stop: bool  # ended by eos, a stop token or a stop string (else by length)


class BeamSearch:
    def __init__(
        self,
        params: GenerationParams,
        prompt_ids: list[int],
        eos_token_ids: list[int],
        vocab_size: int,
        max_new_tokens: int,
        generator: torch.Generator | None,
        stops: Callable[[list[int]], bool],
        token_logprob: Callable[[torch.Tensor, int], TokenLogprob] | None = None,
        device: torch.device | str = "cpu",
    ) -> None:
        """``stops(generated_ids)``: True when a stop string or stop token ends these ids.
        ``token_logprob(log_probs_row, token)``: the reported logprob entry, when the user asked."""
        self.params = params
        self.device = device = torch.device(device)
        self.num_beams = params.num_beams
        self.eos = set() if params.ignore_eos else set(eos_token_ids)
        self.max_new_tokens = max_new_tokens
        self.generator = generator
        self.stops = stops
        self.token_logprob = token_logprob
        self.beams_to_keep = max(2, 1 + len(self.eos)) * self.num_beams
        self.min_tokens_to_keep = len(self.eos) + 1 if self.eos else 2
        states = RowSamplingState(params, prompt_ids, list(eos_token_ids), vocab_size, generator, device)
        self.states = [states] + [states.fork() for _ in range(self.num_beams - 1)]
        self.running = [Hypothesis([]) for _ in range(self.num_beams)]
        self.running_scores = torch.zeros(self.num_beams, device=device)
        self.running_scores[1:] = NEG  # only beam 0 is expanded at first: all beams are the prompt
        self.finished: list[Hypothesis | None] = [None] * self.num_beams
        self.finished_scores = torch.full((self.num_beams,), NEG, device=device)
        self.is_finished = torch.zeros(self.num_beams, dtype=torch.bool, device=device)
        self.improvable = True  # HF's is_early_stop_heuristic_unsatisfied
        self.num_generated = 0

    # ---- one step ------------------------------------------------------------------------------------
    def step(self, logits: torch.Tensor) -> BeamStep:
        """``logits``: ``[num_beams, vocab_size]`` raw float32 logits of the running beams."""
        num_beams, vocab_size = logits.shape
        log_probs = torch.log_softmax(logits, dim=-1)
        batch = SamplingBatch(self.states, logits.device, self.min_tokens_to_keep)
        processed = batch.process(log_probs)  # HF processes log-probs, not logits, in beam search
        bad = unpickable(processed)  # a beam with NaN or all -inf scores: the request fails (400), not the step
        if bad:
            raise NonFiniteScores(bad)
        accumulated = (processed + self.running_scores[:, None]).reshape(1, -1)  # [1, num_beams * vocab]
        if self.params.do_sample:
            chosen = self._sample_candidates(torch.softmax(accumulated, dim=-1))
            top_scores = torch.gather(accumulated, 1, chosen)
        else:
            top_scores, chosen = torch.topk(accumulated, k=self.beams_to_keep)
        top_scores, chosen = top_scores[0], chosen[0]  # [beams_to_keep]
        parents = (chosen // vocab_size).tolist()
        tokens = (chosen % vocab_size).tolist()
        candidates = [
            self.running[p].extend(t, log_probs[p], self.token_logprob) for p, t in zip(parents, tokens, strict=True)
        ]
        hits = torch.tensor([self._hits_stop(c.token_ids) for c in candidates], device=self.device)  # [beams_to_keep]

        # e. the best num_beams candidates that did not stop keep running
        running_scores = top_scores + hits.to(torch.float32) * NEG
        keep = torch.topk(running_scores, k=num_beams)[1].tolist()
        new_parents = [parents[k] for k in keep]
        self.running = [candidates[k] for k in keep]
        self.running_scores = running_scores[keep]
        self.states = continue_states(self.states, new_parents, [tokens[k] for k in keep])

        # f. finished hypotheses: only the first num_beams candidates may enter, length-penalised
        self._merge_finished(top_scores, candidates, hits)

        self.num_generated += 1
        self._update_improvable()
        exists_open_beam = not (bool(self.is_finished.all()) and self.params.early_stopping is True)
        done = not (self.improvable and exists_open_beam and not bool(hits.all()))
        return BeamStep(new_parents, [tokens[k] for k in keep], done)

    def _sample_candidates(self, probs: torch.Tensor) -> torch.Tensor:
        """K draws without replacement, as HF. Where the warpers left fewer than K tokens possible,
        torch fills the rest with zero-probability tokens (their score is -inf, so they only run
        when nothing else can), exactly as in HF."""
        return torch.multinomial(probs, num_samples=self.beams_to_keep, generator=self.generator)

    def _hits_stop(self, token_ids: list[int]) -> bool:
        # HF's MaxLengthCriteria and EosTokenCriteria, plus OpenAI stop strings / stop tokens
        return len(token_ids) >= self.max_new_tokens or token_ids[-1] in self.eos or self.stops(token_ids)

    def _merge_finished(self, top_scores: torch.Tensor, candidates: list[Hypothesis], hits: torch.Tensor) -> None:
        num_beams = self.num_beams
        in_top = torch.zeros(self.beams_to_keep, dtype=torch.bool, device=self.device)
        in_top[:num_beams] = True
        just_finished = hits & in_top
        scores = top_scores / ((self.num_generated + 1) ** self.params.length_penalty)
        beams_full = bool(self.is_finished.all()) and self.params.early_stopping is True
        scores += float(beams_full) * NEG
        scores += float(not self.improvable) * NEG
        scores += (~just_finished) * NEG
        merged_scores = torch.cat((self.finished_scores, scores))
        merged = [*self.finished, *candidates]
        merged_finished = torch.cat((self.is_finished, just_finished))
        best = torch.topk(merged_scores, k=num_beams)[1]
        self.finished = [merged[i] for i in best.tolist()]
        self.finished_scores = merged_scores[best]
        self.is_finished = merged_finished[best]

    def _update_improvable(self) -> None:
        if self.params.early_stopping == "never" and self.params.length_penalty > 0.0:
            best_length = self.max_new_tokens
        else:
            best_length = self.num_generated
        best_running = self.running_scores[:1] / (best_length**self.params.length_penalty)
        worst_finished = torch.where(self.is_finished, torch.min(self.finished_scores), NEG)
        self.improvable = self.improvable and bool(torch.any(best_running > worst_finished))

    # ---- the end ----------------------------------------------------------------------------------------
    def finish_now(self) -> None:
        """Stop early (``max_time``): every running beam counts as finished at its current length,
        as HF's ``MaxTimeCriteria`` makes all candidates of the next step hit a stopping criterion."""
        if self.num_generated == 0:
            return
        scores = self.running_scores / (self.num_generated**self.params.length_penalty)
        scores = scores + (self.running_scores <= NEG / 2).to(torch.float32) * NEG
        merged_scores = torch.cat((self.finished_scores, scores))
        merged = [*self.finished, *self.running]
        ended = torch.ones(self.num_beams, dtype=torch.bool, device=self.device)
        merged_finished = torch.cat((self.is_finished, ended))
        best = torch.topk(merged_scores, k=self.num_beams)[1]
        self.finished = [merged[i] for i in best.tolist()]
        self.finished_scores = merged_scores[best]
        self.is_finished = merged_finished[best]

    def results(self, count: int) -> list[FinalSequence]:
        """The best ``count`` finished hypotheses, best first, as HF returns them."""
        out = []
        for hypothesis, score in zip(self.finished[:count], self.finished_scores[:count].tolist(), strict=True):
            if hypothesis is None:  # cannot happen once the search is done; kept total for safety
                hypothesis = self.running[0]
            ids = hypothesis.token_ids
            hit_stop = bool(ids) and (ids[-1] in self.eos or self.stops(ids))
            out.append(FinalSequence(list(ids), float(score), list(hypothesis.logprobs), hit_stop))
        return out


def continue_states(states: list[RowSamplingState], parents: list[int], tokens: list[int]) -> list[RowSamplingState]:
    """Each new beam's sampling state: its parent's plus its token (HF reorders ``input_ids``).

    A parent with one child hands its state over; a parent with several is forked for each, so no
    state is copied for the common case of one child per parent.
    """
    counts: dict[int, int] = {}
    for parent in parents:
        counts[parent] = counts.get(parent, 0) + 1
    out = []
    for parent, token in zip(parents, tokens, strict=True):
        state = states[parent] if counts[parent] == 1 else states[parent].fork()
        state.append(token)
        out.append(state)
    return out


class BeamDecoding(BeamRows):
    """Beam search, or beam sampling with ``do_sample`` (transformers 5's ``_beam_search``)."""

    def make_search(self) -> BeamSearch:
        request, ctx = self.request, self.ctx
        return BeamSearch(
            request.params,
            request.text_ids,
            ctx.eos_token_ids,
            ctx.vocab_size,
            max_new_tokens=self.max_new_tokens,
            generator=request.rows[0].sampling.generator,
            stops=self.ends,
            token_logprob=self.logprob_fn(),
            device=ctx.device,
        )
