"""A native kernel is loaded only from where no other user can plant code.

The checks are the loader's (``native_kernel.build_and_load``), whatever the library: a one-line C
library stands in for the operator libraries, which take seconds to build against torch."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from decoding.kv import native_kernel

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
OTHER_UID = 65534  # nobody
FLAGS = ["-O2", "-fPIC", "-shared"]


@pytest.fixture
def source(tmp_path: Path) -> Path:
    """A tiny C library as the kernel, in a folder of its own."""
    (tmp_path / "src").mkdir()
    path = tmp_path / "src" / "answer.c"
    path.write_text("int answer(void) { return 42; }\n")
    return path


def load(folder: Path, source: Path, name: str = "kernel-test.so"):  # noqa: ANN201
    library = native_kernel.build_and_load(source, FLAGS, name, dirs=[folder])
    assert library is None or library.answer() == 42
    return library


def test_a_private_directory_builds_and_loads(tmp_path, source):
    folder = tmp_path / "kernels"
    assert load(folder, source) is not None
    assert (folder / "kernel-test.so").is_file()
    assert not [p for p in folder.iterdir() if p.name.startswith(".build-")]  # the private build dir is gone
    assert native_kernel.untrusted_reason(folder, directory=True) is None


def test_a_directory_others_may_write_is_refused(tmp_path, source, caplog):
    folder = tmp_path / "shared"
    folder.mkdir()
    folder.chmod(0o777)
    assert load(folder, source) is None
    assert "writable by others" in caplog.text and not list(folder.iterdir())


def test_a_planted_library_is_never_loaded(tmp_path, source, caplog):
    folder = tmp_path / "kernels"
    assert load(folder, source) is not None
    planted = folder / "kernel-test.so"
    planted.chmod(0o666)  # anyone could have replaced it
    assert load(folder, source) is None and "writable by others" in caplog.text
    planted.chmod(0o755)
    link = folder / "kernel-link.so"
    link.symlink_to(planted)
    assert load(folder, source, link.name) is None
    if os.geteuid() == 0:  # only root can give a file away
        os.chown(planted, OTHER_UID, OTHER_UID)
        assert load(folder, source) is None and f"owned by uid {OTHER_UID}" in caplog.text


def test_the_shared_temporary_folder_is_per_user():
    assert native_kernel.kernel_dirs()[-1].name == f"decoda-kernels-{os.geteuid()}"


def test_a_cached_kernel_loads_without_a_compiler(tmp_path, source, monkeypatch):
    """The image builds its kernel, then removes gcc: the cached library must still load."""
    folder = tmp_path / "kernels"
    assert load(folder, source) is not None
    monkeypatch.setenv("CC", "no-such-compiler")
    assert load(folder, source) is not None
    assert load(folder, source, "kernel-other.so") is None
