"""A first start's native builds run in the background and leave the same state the load would."""

from __future__ import annotations

import logging

import pytest
import torch

from decoding.config import EngineConfig
from decoding.engine import prebuild
from decoding.kv import paged_attention
from decoding.model.quantization import block_matrix, ktile_matrix


def test_the_builds_leave_the_operators_loaded() -> None:
    wait = prebuild.start_builds(EngineConfig(quantization="gguf"))
    wait()
    assert paged_attention._loaded and block_matrix._state  # decided once: the load only reads them
    assert ktile_matrix._state  # a GGUF's K-quants' kernel too
    assert paged_attention.native_available() == bool(paged_attention._loaded[0])


def test_inductor_set_up_probes_the_isa_it_picks_and_builds_the_header_once() -> None:
    from torch._inductor import cpu_vec_isa

    prebuild.start_builds(EngineConfig(compile=True))()  # waits for the ISA, not for the header
    assert "isa" in prebuild._done
    prebuild._inductor_header()  # waits for the one under way, then finds it done
    assert prebuild._done == {"isa", "header"}
    cpu_flags = set(cpu_vec_isa.x86_isa_checker())
    reported = [isa for isa in cpu_vec_isa.supported_vec_isa_list if set(str(isa).split()) <= cpu_flags]
    picked = cpu_vec_isa.pick_vec_isa()
    if reported:  # inductor's rule: the first the CPU reports that passes its check
        first_passing = next(isa for isa in reported if isa.check_build(cpu_vec_isa.VecISA._avx_code))
        assert str(picked) == str(first_passing)
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
