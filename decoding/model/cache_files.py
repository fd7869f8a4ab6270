"""Names and sizes of what Decoda keeps in its cache (``~/.cache/decoda`` or ``--cache-dir``).

A cached folder is named by what it was made from, so a changed source or a changed transformers
gets a new folder instead of stale files: the source files' path, size and mtime, and the
transformers version that read them.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import transformers

CACHE_FORMAT = 1  # bump when the cache layout changes, so old folders are not reused


def made(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def cache_key(parts: list[Path]) -> str:
    """Changes when the source (path, size, mtime) or the transformers that reads it changes."""
    stats = [(str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) for p in parts]
    blob = json.dumps([CACHE_FORMAT, transformers.__version__, stats])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def folder_bytes(folder: Path) -> int:
    """What a cached folder holds on disk, in bytes (for the load log)."""
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def publish(tmp: Path, final: Path, marker_name: str, marker: dict) -> int:
    """Make a folder written in ``tmp`` the cache's ``final`` at once: the marker (present = complete)
    written last, readable by the replicas' users, renamed into place; a replica that published the
    same folder first wins. Returns the folder's bytes (for the load log)."""
    (tmp / marker_name).write_text(json.dumps(marker, indent=2))
    tmp.chmod(0o755)  # mkdtemp makes it private; the cache may be shared by replicas' users
    written = folder_bytes(tmp)
    try:
        os.rename(tmp, final)
    except OSError:
        if not (final / marker_name).is_file():
            raise
    return written
