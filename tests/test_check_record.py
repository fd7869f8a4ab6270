"""The paged-attention check at load runs once per model, code and versions: a later start with the same
weights, config, dtype and engine code finds its recorded pass; any change runs it again, and a failed
check is never recorded. On the previous main it ran at every start (~40 s of a Qwen2.5-1.5B start on
the busy 2-core machine)."""

from __future__ import annotations

from pathlib import Path

import pytest

from decoding.model import check_record, loading
from decoding.model.attention import register_attention
from decoding.model.loading import load_model
from decoding.model.registry import ModelLoadError
from tests.tiny_gguf import write_tiny_gguf


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The check still runs for real; each run is listed."""
    runs: list[str] = []
    real = loading.check_model

    def counting(model, name):  # noqa: ANN001, ANN202
        runs.append(name)
        real(model, name)

    monkeypatch.setattr(loading, "check_model", counting)
    return runs


def test_a_passed_check_is_not_run_again_until_something_changes(tmp_path, monkeypatch, counted):
    engine = tmp_path / "engine"
    (engine / "model").mkdir(parents=True)
    (engine / "model" / "attention.py").write_text("# the engine's code\n")
    monkeypatch.setattr(check_record, "ENGINE_ROOT", engine)
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf")

    def load(dtype: str = "float32") -> None:
        load_model(str(gguf), quantization="gguf", dtype=dtype, cache_dir=str(tmp_path / "cache"),
                   attn_implementation=register_attention())  # fmt: skip

    load()
    assert len(counted) == 1 and len(list((tmp_path / "cache" / "checks").iterdir())) == 1
    load()
    assert len(counted) == 1  # recorded: not run again
    load("bfloat16")
    assert len(counted) == 2  # another dtype: other numerics
    (engine / "model" / "attention.py").write_text("# the engine's code, changed\n")
    load()
    assert len(counted) == 3  # the code under check changed


def test_a_failed_check_is_not_recorded(tmp_path, monkeypatch):
    def failing(model, name):  # noqa: ANN001, ANN202
        raise ModelLoadError("architecture qwen2 gives different logits")

    monkeypatch.setattr(loading, "check_model", failing)
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf")
    for _ in range(2):  # refused both times: nothing remembered a pass
        with pytest.raises(ModelLoadError, match="different logits"):
            load_model(str(gguf), quantization="gguf", cache_dir=str(tmp_path / "cache"),
                       attn_implementation=register_attention())  # fmt: skip
    assert not (Path(tmp_path) / "cache" / "checks").exists()
