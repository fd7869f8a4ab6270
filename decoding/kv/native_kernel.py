"""Building and loading a small native kernel so that nobody else can plant the code we run.

The kernel is compiled on first use and cached as a shared library; loading it
(``torch.ops.load_library`` for the PyTorch operator libraries, ``build_operators``; any ``dlopen``)
runs whatever file it finds under that name, as the server's user. So a cache directory is used only
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
import hashlib
import logging
import os
import platform
import shutil
import stat
import subprocess
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T")

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


def build_and_load(
    source: Path,
    flags: list[str],
    name: str,
    dirs: list[Path] | None = None,
    *,
    load: Callable[[str], T] = ctypes.CDLL,  # type: ignore[assignment]
    compiler: tuple[str, str] = ("CC", "cc"),
    libraries: tuple[str, ...] = ("-lm",),
) -> T | None:
    """The kernel ``name`` (a file name keyed by source, flags and CPU) from the first trusted
    directory, compiling it there first when it is not cached; None when no directory will do. A
    cached kernel needs no compiler (the image builds its kernel, then removes the compiler).
    ``load`` opens the trusted file (ctypes for a C library, ``torch.ops.load_library`` for an
    operator library); ``compiler`` names the variable that may override the default compiler."""
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
                program = shutil.which(os.environ.get(*compiler))
                if program is None:
                    logger.warning("no compiler (%s): %s is not built; install gcc/g++", compiler[1], source.name)
                    return None
                _compile([program, *flags, str(source)], list(libraries), folder, target)
            problem = untrusted_reason(target, directory=False)
            if problem is not None:
                logger.warning("not loading %s: %s", target, problem)
                continue
            return load(str(target))
        except (OSError, subprocess.SubprocessError) as error:
            logger.debug("kernel not built in %s: %s", folder, error)
    return None


def _compile(command: list[str], libraries: list[str], folder: Path, target: Path) -> None:
    private = Path(tempfile.mkdtemp(prefix=".build-", dir=folder))  # 0700: only this user writes here
    try:
        built = private / target.name
        subprocess.run([*command, "-o", str(built), *libraries], check=True, capture_output=True, timeout=300)
        built.chmod(0o755)
        built.replace(target)  # atomic on one file system: replicas starting together never load half a file
    finally:
        shutil.rmtree(private, ignore_errors=True)


def cpu_id() -> bytes:
    """-march=native code is only valid on this CPU: the build is keyed by its flags."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line.encode()
    except OSError:
        pass
    return platform.processor().encode()


def build_operators(source: Path, stem: str, register: Callable[[], None] | None = None) -> Path | None:
    """Build a PyTorch operator library (``STABLE_TORCH_LIBRARY``) from ``source`` against the installed
    torch for this CPU, load it into the process and run ``register`` (its fake shapes); the
    library's path, or None when it cannot be built or trusted. Keyed by source, flags, CPU flags
    and torch version; ``DECODA_KERNEL_MARCH`` names a portable target instead of ``native`` (the
    Dockerfile's image build)."""
    import torch

    include = Path(torch.__file__).parent / "include"
    library_dir = Path(torch.__file__).parent / "lib"
    march = os.environ.get("DECODA_KERNEL_MARCH", "native")
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    flags = [
        "-O3", f"-march={march}", "-fopenmp", "-fPIC", "-shared", "-std=c++17", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
        f"-I{include}", "-w",
    ]  # fmt: skip
    libraries = (f"-L{library_dir}", f"-Wl,-rpath,{library_dir}", "-lc10", "-ltorch_cpu")
    machine = cpu_id() if march == "native" else march.encode()
    key = source.read_bytes() + " ".join(flags).encode() + machine + torch.__version__.encode()
    name = f"{stem}-{hashlib.sha256(key).hexdigest()[:16]}.so"

    def load(path: str) -> Path:
        torch.ops.load_library(path)
        if register is not None:
            register()
        return Path(path)

    return build_and_load(source, flags, name, load=load, compiler=("CXX", "g++"), libraries=libraries)


def build_once(
    source: Path, stem: str, register: Callable[[], None] | None = None, unavailable: str = ""
) -> Callable[[], bool]:
    """An ``available()`` for one operator library: its first call builds and loads it
    (``build_operators``), later calls answer from memory. Thread-safe: the start's background build
    (``engine/prebuild``) and a first use may ask at once, and the second waits for the one build. A
    library that cannot be built logs ``unavailable`` once (what runs instead) and answers False."""
    state: list[bool] = []
    lock = threading.Lock()

    def available() -> bool:
        if not state:
            with lock:
                if not state:
                    built = build_operators(source, stem, register) is not None
                    if not built:
                        logger.warning("%s", unavailable or f"{stem} kernel unavailable")
                    state.append(built)
        return state[0]

    return available
