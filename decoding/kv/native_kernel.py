"""Building and loading a small native kernel so that nobody else can plant the code we run.

The kernel is compiled on first use and cached as a shared library; ``ctypes.CDLL`` then runs
whatever file it finds under that name, as the server's user. So a cache directory is used only
when it belongs to this user (or root: the image builds its kernel as root) and no one else may
write to it (checked with ``lstat``: a symlink planted in its place is refused too), a library only
when it is a regular file of the same owners that no one else may write, and a build goes into a
private temporary directory (``mkdtemp``: 0700) and is renamed into place atomically, so a replica
never loads half a file and no other user can swap the file between the check and the load. A
directory that fails the checks is skipped with a warning naming it; with none left the caller
falls back to its PyTorch path.
"""

from __future__ import annotations

import ctypes
import logging
import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

logger = logging.getLogger(__name__)

_SHARED_WRITE = stat.S_IWGRP | stat.S_IWOTH


def untrusted_reason(path: Path, directory: bool) -> str | None:
    """Why ``path`` may not be trusted (None: it may): owner, kind and who else may write to it."""
    try:
        info = path.lstat()
    except OSError as error:
        return f"cannot stat: {error}"
    kind_ok = stat.S_ISDIR(info.st_mode) if directory else stat.S_ISREG(info.st_mode)
    if not kind_ok:
        return "not a directory" if directory else "not a regular file (a symlink?)"
    if info.st_uid not in (os.geteuid(), 0):  # root's files are as safe as root already is (the image's)
        return f"owned by uid {info.st_uid}, neither this user ({os.geteuid()}) nor root"
    if info.st_mode & _SHARED_WRITE:
        return f"writable by others (mode {stat.S_IMODE(info.st_mode):o})"
    return None


def kernel_dirs() -> list[Path]:
    """Where a built kernel may be cached: ``DECODA_KERNEL_DIR``, the user cache, then a per-user
    directory in the system's temporary folder (a shared name there would be anyone's to take)."""
    dirs = [Path(d) for d in (os.environ.get("DECODA_KERNEL_DIR"),) if d]
    dirs.append(Path.home() / ".cache" / "decoda" / "kernels")
    dirs.append(Path(tempfile.gettempdir()) / f"decoda-kernels-{os.geteuid()}")
    return dirs


def build_and_load(source: Path, flags: list[str], name: str, dirs: list[Path] | None = None) -> ctypes.CDLL | None:
    """The kernel ``name`` (a file name keyed by source, flags and CPU) from the first trusted
    directory, compiling it there first when it is not cached; None when no directory will do. A
    cached kernel needs no compiler (the image builds its kernel, then removes the compiler)."""
    for folder in kernel_dirs() if dirs is None else dirs:
        try:
            folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as error:
            logger.debug("kernel directory %s unusable: %s", folder, error)
            continue
        problem = untrusted_reason(folder, directory=True)
        if problem is not None:
            logger.warning("not using kernel directory %s: %s", folder, problem)
            continue
        target = folder / name
        try:
            if not os.path.lexists(target):
                compiler = shutil.which(os.environ.get("CC", "cc"))
                if compiler is None:
                    logger.warning("no C compiler: %s is not built; install gcc", source.name)
                    return None
                _compile(compiler, flags, source, folder, target)
            problem = untrusted_reason(target, directory=False)
            if problem is not None:
                logger.warning("not loading %s: %s", target, problem)
                continue
            return ctypes.CDLL(str(target))
        except (OSError, subprocess.SubprocessError) as error:
            logger.debug("kernel not built in %s: %s", folder, error)
    return None


def _compile(compiler: str, flags: list[str], source: Path, folder: Path, target: Path) -> None:
    private = Path(tempfile.mkdtemp(prefix=".build-", dir=folder))  # 0700: only this user writes here
    try:
        built = private / target.name
        subprocess.run([compiler, *flags, str(source), "-o", str(built), "-lm"], check=True, capture_output=True,
                       timeout=120)  # fmt: skip
        built.chmod(0o755)
        built.replace(target)  # atomic on one file system: replicas starting together never load half a file
    finally:
        shutil.rmtree(private, ignore_errors=True)
