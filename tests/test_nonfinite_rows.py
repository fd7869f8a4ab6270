"""Rows no token can be picked from (NaN scores, or every token at -inf) on every picker: greedy, top-k,
top-p over a small and a large (> 16k, the power-of-two cut) vocabulary, min_p, typical_p, epsilon/eta,
beam search. Each is the request's 400 (``NonFiniteScores`` naming its row, code ``invalid_request``),
raised before anything is drawn, so the other rows of the batch keep the tokens they would have had."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from decoding.engine import sample_stage
from decoding.params import GenerationParams
from decoding.sampling import BatchSampler, RowSamplingState, SamplingBatch, make_generator
from decoding.sampling.finite import NonFiniteScores
from decoding.sampling.nucleus import SORT_BELOW, top_p
from decoding.strategies.beam import BeamSearch
from tests.engine_harness import EngineHarness, tiny_llama

SMALL, LARGE = 1000, SORT_BELOW * 2
NAN, NEG_INF = float("nan"), float("-inf")
PATHS = {
    "greedy": GenerationParams(),
    "sample": GenerationParams(do_sample=True),
    "top_k": GenerationParams(do_sample=True, top_k=5),
    "top_p": GenerationParams(do_sample=True, top_p=0.9),
    "min_p": GenerationParams(do_sample=True, min_p=0.1),
    "typical_p": GenerationParams(do_sample=True, typical_p=0.9),
    "epsilon": GenerationParams(do_sample=True, epsilon_cutoff=3e-4),
    "eta": GenerationParams(do_sample=True, eta_cutoff=3e-4),
    "temperature": GenerationParams(do_sample=True, temperature=0.7, top_k=50, top_p=0.8),
}
HEALTHY = [GenerationParams(do_sample=True, top_p=0.9, seed=5), GenerationParams()]


def _bad_row(kind: str, vocab: int) -> torch.Tensor:
    row = torch.randn(vocab, generator=torch.Generator().manual_seed(1))
    if kind == "nan":
        return torch.full((vocab,), NAN)
    if kind == "one_nan":
        row[vocab // 3] = NAN
        return row
    if kind == "negative_nan":  # a NaN with its sign bit set: top-p's exponent buckets once indexed -1 with it
        return torch.full((vocab,), NAN).view(torch.int32).bitwise_or(-(2**31)).view(torch.float32)
    return torch.full((vocab,), NEG_INF)


def _row(params: GenerationParams, vocab: int, seed: int = 5) -> RowSamplingState:
    generator = make_generator(seed) if params.do_sample else None
    return RowSamplingState(params, [1, 2], [0], vocab, generator)


def _healthy_logits(vocab: int) -> torch.Tensor:
    return torch.randn(2, vocab, generator=torch.Generator().manual_seed(2)) * 3


@pytest.mark.parametrize("vocab", [SMALL, LARGE], ids=["small_vocab", "large_vocab"])
@pytest.mark.parametrize("kind", ["nan", "one_nan", "negative_nan", "all_neg_inf"])
@pytest.mark.parametrize("path", list(PATHS))
def test_a_row_without_a_pickable_token_is_named_and_the_others_keep_their_tokens(path, kind, vocab):
    healthy = _healthy_logits(vocab)
    alone = SamplingBatch.from_rows([_row(p, vocab) for p in HEALTHY])
    expected = alone.sample(alone.process(healthy))

    rows = [_row(HEALTHY[0], vocab), _row(PATHS[path], vocab, seed=9), _row(HEALTHY[1], vocab)]
    batch = SamplingBatch.from_rows(rows)
    logits = torch.stack([healthy[0], _bad_row(kind, vocab), healthy[1]])
    scores = batch.process(logits)  # every warper takes the row without raising (top-p's large vocab included)
    with pytest.raises(NonFiniteScores) as raised:
        batch.sample(scores)
    assert raised.value.rows == [1]
    # nothing was drawn: the healthy rows, picked again without it, give what they give alone
    again = SamplingBatch.from_rows([rows[0], rows[2]])
    assert again.sample(again.process(healthy)) == expected


def test_large_vocab_top_p_keeps_a_nan_row_for_the_pick_to_refuse():
    scores = torch.stack([_bad_row("negative_nan", LARGE), _bad_row("all_neg_inf", LARGE), _healthy_logits(LARGE)[0]])
    out = top_p(scores, torch.full((3, 1), 0.1))  # previous main: IndexError (index -1 of the 256 buckets)
    assert torch.isfinite(out[2]).any() and not bool((out[:2] > NEG_INF).any())


class _Strategy:
    def __init__(self, name: str) -> None:
        self.request = SimpleNamespace(request_id=name, error=None)
        self.accepted: list[int] = []

    def accept(self, row: object, token: int, logits: torch.Tensor, now: float) -> None:
        self.accepted.append(token)


def test_the_sample_stage_fails_only_the_request_of_the_bad_row():
    vocab = LARGE
    healthy = _healthy_logits(vocab)
    alone = SamplingBatch.from_rows([_row(p, vocab) for p in HEALTHY])
    expected = alone.sample(alone.process(healthy))
    strategies = [_Strategy("a"), _Strategy("bad"), _Strategy("b")]
    rows = [_row(HEALTHY[0], vocab), _row(PATHS["top_p"], vocab), _row(HEALTHY[1], vocab)]
    logits = [healthy[0], _bad_row("nan", vocab), healthy[1]]
    picks = [SimpleNamespace(strategy=s, row=SimpleNamespace(sampling=r), logits=x)
             for s, r, x in zip(strategies, rows, logits, strict=True)]  # fmt: skip
    failed = []

    def fail(strategy, message, code="internal", cause=None) -> None:  # noqa: ANN001
        strategy.request.error = message
        failed.append((strategy.request.request_id, code, type(cause)))

    sample_stage.sample(BatchSampler(torch.device("cpu")), picks, fail)
    assert failed == [("bad", "invalid_request", NonFiniteScores)]
    assert [strategies[0].accepted, strategies[2].accepted] == [[expected[0]], [expected[1]]]


@pytest.mark.parametrize("kind", ["nan", "all_neg_inf"])
@pytest.mark.parametrize("sampled", [False, True], ids=["beam", "beam_sample"])
def test_beam_search_refuses_a_beam_without_a_pickable_token(kind, sampled):
    params = GenerationParams(num_beams=2, do_sample=sampled, max_new_tokens=4)
    beam = BeamSearch(params, [1, 2], [0], SMALL, 4, make_generator(3), lambda ids: False)
    logits = torch.stack([_healthy_logits(SMALL)[0], _bad_row(kind, SMALL)])
    with pytest.raises(NonFiniteScores) as raised:
        beam.step(logits)
    assert raised.value.rows == [1]


class _Bytes:
    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(chr(65 + i % 26) for i in ids)


def test_in_the_engine_a_request_banning_every_token_fails_alone_with_a_400():
    """Large-vocabulary top-p on a row where every token is banned: previous main raised inside top-p
    (an "internal" 500); the request now fails as a bad request and its neighbours finish as alone."""
    vocab = LARGE
    model = tiny_llama(vocab, seed=4)
    prompt = [5, 6, 7, 8]
    seeded = GenerationParams(max_new_tokens=4, do_sample=True, top_p=0.9, seed=3, ignore_eos=True)
    greedy = GenerationParams(max_new_tokens=4, ignore_eos=True)
    banned = GenerationParams(max_new_tokens=4, do_sample=True, top_p=0.9, suppress_tokens=list(range(vocab)))

    alone = EngineHarness(model, _Bytes(), [0])
    alone.add("seeded", prompt, seeded)
    alone.add("greedy", prompt, greedy)
    alone.run()
    crowd = EngineHarness(model, _Bytes(), [0])
    crowd.add("seeded", prompt, seeded)
    crowd.add("banned", prompt, banned)
    crowd.add("greedy", prompt, greedy)
    crowd.run()
    (last,) = [out for out in crowd.outputs["banned"] if out.finished]
    assert last.error_code == "invalid_request" and "no token can be picked" in last.error
    assert crowd.token_ids("seeded") == alone.token_ids("seeded")
    assert crowd.token_ids("greedy") == alone.token_ids("greedy")
