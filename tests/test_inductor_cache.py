"""``--compile`` loads inductor's kernels only from a private directory, checked as our own kernels'.

Nothing is compiled here: the tests check where inductor is told to keep (and load) its kernels, as
inductor itself reads it, and that a directory another user could write is never that place."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import torch

from decoding.config import EngineConfig
from decoding.engine.prebuild import start_builds
from decoding.model import inductor_cache
from decoding.model.compile import compile_model
from decoding.model.inductor_cache import UntrustedCacheError, private_inductor_cache
from tests.engine_harness import tiny_llama


@pytest.fixture
def kernel_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The kernel directory of this test; inductor's setting is restored afterwards."""
    folder = tmp_path / "kernels"
    monkeypatch.setenv("DECODA_KERNEL_DIR", str(folder))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "before"))
    return folder


def inductors_own_cache_dir() -> Path:
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return Path(cache_dir())


def test_a_compiling_start_points_inductor_at_a_private_directory_under_the_kernel_directory(kernel_dir):
    start_builds(EngineConfig(compile=True, device="meta"))  # not a CPU: no build starts, the cache is set
    cache = kernel_dir / "inductor"
    assert inductors_own_cache_dir() == cache  # not /tmp/torchinductor_<user>
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700 and cache.stat().st_uid == os.geteuid()


def test_compile_model_points_inductor_at_the_private_directory(kernel_dir):
    compile_model(tiny_llama(vocab_size=64), backend="inductor")  # compiles lazily: at the first forward
    assert inductors_own_cache_dir() == kernel_dir / "inductor"
    torch._dynamo.reset()


def test_a_start_without_compile_leaves_inductor_alone(kernel_dir, tmp_path):
    start_builds(EngineConfig(compile=False, device="meta"))
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "before")


def test_a_directory_others_may_write_is_skipped(tmp_path, caplog):
    shared, private = tmp_path / "shared", tmp_path / "private"
    shared.mkdir()
    shared.chmod(0o777)
    assert private_inductor_cache([shared, private]) == private / "inductor"
    assert "writable by others" in caplog.text and not list(shared.iterdir())


def test_a_planted_inductor_folder_is_refused(tmp_path):
    kernels, elsewhere = tmp_path / "kernels", tmp_path / "elsewhere"
    kernels.mkdir(mode=0o700)
    elsewhere.mkdir(mode=0o700)
    (kernels / "inductor").symlink_to(elsewhere)  # a link in its place: where it points is not checked
    with pytest.raises(UntrustedCacheError, match="not a directory"):
        private_inductor_cache([kernels])
    (kernels / "inductor").unlink()
    (kernels / "inductor").mkdir()
    (kernels / "inductor").chmod(0o757)  # anyone could plant a kernel in it
    with pytest.raises(UntrustedCacheError, match="writable by others"):
        private_inductor_cache([kernels])


def test_with_no_private_directory_a_compiling_start_fails_and_inductor_is_not_pointed_anywhere(
    kernel_dir, tmp_path, monkeypatch
):
    kernel_dir.mkdir()
    kernel_dir.chmod(0o777)
    monkeypatch.setattr(inductor_cache, "kernel_dirs", lambda: [kernel_dir])
    with pytest.raises(UntrustedCacheError, match="DECODA_KERNEL_DIR"):
        start_builds(EngineConfig(compile=True, device="meta"))
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "before")
