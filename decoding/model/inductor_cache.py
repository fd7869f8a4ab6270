"""Where ``--compile`` keeps inductor's compiled kernels: a private directory, checked like our own.

Inductor writes every kernel it compiles as a shared library under its cache directory and loads
it from there, later starts included (that is its cache). Its default is ``/tmp/torchinductor_<user>``,
a name in a folder every user may write: another user who creates it first, or plants a library
in it, has the server run their code. So ``--compile`` points inductor at ``inductor/`` under the
first kernel directory that passes the checks the project's own kernels pass
(``decoding.kv.native_kernel``: owned by this user or root, not writable by group or others, not
a symlink), created 0700 and checked the same way before use. Inductor reads its cache directory
from ``TORCHINDUCTOR_CACHE_DIR`` on every use, and hands it to its compile subprocesses when it
starts them, so it is set before inductor's first compile and before its worker pool starts
(``decoding.engine.prebuild``).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from decoding.kv.native_kernel import kernel_dirs, untrusted_reason

logger = logging.getLogger(__name__)

INDUCTOR_SUBDIR = "inductor"
INDUCTOR_CACHE_VARIABLE = "TORCHINDUCTOR_CACHE_DIR"  # what inductor reads (torch._inductor.runtime.cache_dir_utils)


class UntrustedCacheError(RuntimeError):
    """No directory is private enough to load compiled kernels from: ``--compile`` cannot run safely."""


def private_inductor_cache(dirs: list[Path] | None = None) -> Path:
    """``inductor/`` under the first of ``dirs`` (default: the kernel directories) that this user owns
    and no one else may write, made 0700; a directory that fails a check is skipped with a warning."""
    refused = []
    for folder in kernel_dirs() if dirs is None else dirs:
        problem = _unusable(folder) or _unusable(folder / INDUCTOR_SUBDIR)  # nothing is made in a refused one
        if problem is not None:
            logger.warning("not keeping inductor's kernels under %s: %s", folder, problem)
            refused.append(f"{folder}: {problem}")
            continue
        return folder / INDUCTOR_SUBDIR
    raise UntrustedCacheError(
        "--compile: no private directory for inductor's compiled kernels ("
        + "; ".join(refused)
        + "); set DECODA_KERNEL_DIR to a directory only you can write"
    )


def _unusable(folder: Path) -> str | None:
    """Why ``folder`` (made 0700 when missing) may not hold inductor's kernels; None when it may."""
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as error:
        return f"cannot create {folder}: {error.strerror or error}"
    problem = untrusted_reason(folder, directory=True)
    if problem is None and not os.access(folder, os.W_OK | os.X_OK):  # root's (the image's): read-only here
        problem = "not writable by this user"
    return None if problem is None else f"{folder}: {problem}"


def use_private_inductor_cache(dirs: list[Path] | None = None) -> Path:
    """Point inductor's cache at ``private_inductor_cache(dirs)``; returns the directory."""
    cache = private_inductor_cache(dirs)
    os.environ[INDUCTOR_CACHE_VARIABLE] = str(cache)
    return cache
