"""The paged-attention kernel is loaded only from where no other user can plant code."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from decoding.kv import native_kernel
from decoding.kv.paged_attention import FLAGS, SOURCE

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
OTHER_UID = 65534  # nobody


def load(folder: Path):  # noqa: ANN201
    return native_kernel.build_and_load(SOURCE, FLAGS, "paged_decode-test.so", dirs=[folder])


def test_a_private_directory_builds_and_loads(tmp_path):
    folder = tmp_path / "kernels"
    assert load(folder) is not None
    assert (folder / "paged_decode-test.so").is_file()
    assert not [p for p in folder.iterdir() if p.name.startswith(".build-")]  # the private build dir is gone
    assert native_kernel.untrusted_reason(folder, directory=True) is None


def test_a_directory_others_may_write_is_refused(tmp_path, caplog):
    folder = tmp_path / "shared"
    folder.mkdir()
    folder.chmod(0o777)
    assert load(folder) is None
    assert "writable by others" in caplog.text and not list(folder.iterdir())


def test_a_planted_library_is_never_loaded(tmp_path, caplog):
    folder = tmp_path / "kernels"
    assert load(folder) is not None
    planted = folder / "paged_decode-test.so"
    planted.chmod(0o666)  # anyone could have replaced it
    assert load(folder) is None and "writable by others" in caplog.text
    planted.chmod(0o755)
    link = folder / "paged_decode-link.so"
    link.symlink_to(planted)
    assert native_kernel.build_and_load(SOURCE, FLAGS, link.name, dirs=[folder]) is None
    if os.geteuid() == 0:  # only root can give a file away
        os.chown(planted, OTHER_UID, OTHER_UID)
        assert load(folder) is None and f"owned by uid {OTHER_UID}" in caplog.text


def test_the_shared_temporary_folder_is_per_user():
    assert native_kernel.kernel_dirs()[-1].name == f"decoda-kernels-{os.geteuid()}"


def test_a_cached_kernel_loads_without_a_compiler(tmp_path, monkeypatch):
    """The image builds its kernel, then removes gcc: the cached library must still load."""
    folder = tmp_path / "kernels"
    assert load(folder) is not None
    monkeypatch.setenv("CC", "no-such-compiler")
    assert load(folder) is not None
    assert native_kernel.build_and_load(SOURCE, FLAGS, "paged_decode-other.so", dirs=[folder]) is None
