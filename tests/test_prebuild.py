"""A first start's native builds run in the background and leave the same state the load would."""

from __future__ import annotations

import logging

import pytest
import torch

from decoding.config import EngineConfig
from decoding.engine import prebuild
from decoding.kv import paged_attention
from decoding.model.quantization import block_matrix


def test_the_builds_leave_the_operators_loaded() -> None:
    wait = prebuild.start_builds(EngineConfig(quantization="gguf"))
    wait()
    assert paged_attention._loaded and block_matrix._state  # decided once: the load only reads them
    assert paged_attention.native_available() == bool(paged_attention._loaded[0])


def test_inductor_set_up_runs_once_and_later_calls_wait_for_it() -> None:
    from torch._inductor import cpu_vec_isa

    prebuild.start_builds(EngineConfig(compile=True))()  # not waited for
    prebuild._inductor()  # waits for the one under way, then finds it done
    assert prebuild._inductor_ready == [True]
    assert cpu_vec_isa.valid_vec_isa_list()  # probed: the compile's own call finds the results
    compiled = torch.compile(lambda x: x * 3.0 + 1.0, backend="inductor")
    assert torch.equal(compiled(torch.ones(4)), torch.full((4,), 4.0))  # the compile uses what it set up


def test_no_builds_off_the_cpu_or_for_a_device_that_is_not_one() -> None:
    for device in ("meta", "gpu"):  # "gpu" is the engine's to refuse, with its own message
        wait = prebuild.start_builds(EngineConfig(device=device, quantization="gguf", compile=True))
        assert wait() is None


def test_a_failing_build_is_left_for_the_load_to_report(monkeypatch: pytest.MonkeyPatch, caplog) -> None:
    def broken() -> bool:
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(paged_attention, "native_available", broken)
    with caplog.at_level(logging.DEBUG, logger="decoding.engine.prebuild"):
        prebuild.start_builds(EngineConfig())()  # does not raise
    assert "background build broken failed" in caplog.text
