"""Watermarking cannot be turned against the server: hashing keys cannot thrash the selfhash table,
a selfhash seed costs one tensor op however wide its context, detection stops when its client
leaves, and a detect text is measured before the tokenizer runs."""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch

from decoding import GenerationParams
from decoding.params.model_checks import ModelFacts
from decoding.params.watermarking import WatermarkingConfig
from decoding.sampling import watermark
from decoding.sampling.row_state import RowSamplingState
from decoding.sampling.watermark import (
    TABLE_SIZE,
    DetectionCancelled,
    WatermarkProcessor,
    _int64,
    _selfhash_seeds,
    detect_watermark,
    fixed_table,
)
from server.api.watermark.route import _score_off_loop
from tests.fake_engine import FakeEngineClient
from tests.test_api import MODEL, client_for, error_of, run

VOCAB = 300


def test_selfhash_seeds_wrap_as_hf_int64_products_for_every_candidate_at_once():
    key = 2**62 + 12345  # products overflow int64 and wrap, as HF's tensors do
    config = WatermarkingConfig(seeding_scheme="selfhash", hashing_key=key, context_width=6)
    table = fixed_table(key, VOCAB)
    context, candidates = [5, 17, 299, 0, 42], [1, 7, 299]
    expected = []
    for c in candidates:
        b = int(table[c]) + 1
        expected.append(min(_int64(key * (int(table[t]) + 1) * b) for t in [*context, c]) % (2**64 - 1))
    assert _selfhash_seeds(config, context, candidates, table) == expected


def test_rows_rotating_through_many_hashing_keys_draw_each_table_once(monkeypatch):
    fixed_table.cache_clear()
    draws = []
    real = torch.randperm

    def counting(n, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        if n == TABLE_SIZE:
            draws.append(n)
        return real(n, *args, **kwargs)

    monkeypatch.setattr(watermark.torch, "randperm", counting)
    rows = []
    for key in range(1, 7):  # more keys than the table cache holds at once... and rows in one batch
        config = WatermarkingConfig(seeding_scheme="selfhash", hashing_key=key * 7919, context_width=2)
        rows.append(RowSamplingState(GenerationParams(watermarking_config=config), [1, 2, 3], [0], VOCAB, None))
    for step in range(5):
        processor = WatermarkProcessor(list(enumerate(rows)), VOCAB)  # rebuilt each step, as beams do
        processor.apply(torch.randn(len(rows), VOCAB, generator=torch.Generator().manual_seed(step)))
        for row in rows:
            row.append(step + 4)
    assert len(draws) == len(rows)  # one draw per row's key, none per step


def test_detection_stops_when_asked():
    config = WatermarkingConfig()
    ids = list(range(1, 200))
    assert detect_watermark(ids, config, VOCAB).num_tokens_scored == 198
    with pytest.raises(DetectionCancelled):
        detect_watermark(ids, config, VOCAB, cancelled=lambda: True)


def test_a_cancelled_detect_task_stops_its_scoring_thread():
    started, stopped = threading.Event(), threading.Event()

    def slow_score(cancelled):  # noqa: ANN001, ANN202
        started.set()
        while not cancelled():
            threading.Event().wait(0.01)
        stopped.set()
        raise DetectionCancelled

    async def go() -> None:
        task = asyncio.ensure_future(_score_off_loop(slow_score))
        await asyncio.to_thread(started.wait, 5)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(go())
    assert stopped.wait(5)


class _CountingEngine(FakeEngineClient):
    facts = ModelFacts(vocab_size=100, max_model_len=64, num_layers=4, max_chars_per_token=8)

    def __init__(self) -> None:
        super().__init__()
        self.tokenized = 0

    async def tokenize(self, text: str, add_special_tokens: bool = True) -> list[int]:
        self.tokenized += 1
        return await super().tokenize(text, add_special_tokens)


def test_a_detect_text_longer_than_the_context_can_spell_is_refused_before_tokenizing():
    engine = _CountingEngine()

    async def go():  # noqa: ANN202
        async with client_for(engine) as http:
            body = {"model": MODEL, "text": "x" * (64 * 8 + 1), "watermarking_config": {}}
            return await http.post("/v1/watermark/detect", json=body)

    r = run(go())
    assert r.status_code == 400 and error_of(r)["param"] == "text"
    assert error_of(r)["code"] == "context_length_exceeded" and engine.tokenized == 0
