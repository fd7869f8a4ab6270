"""Names and sizes of what Decoda keeps in its cache (``~/.cache/decoda`` or ``--cache-dir``).

A cached folder is named by what it was made from, so a changed source or a changed transformers
gets a new folder instead of stale files: the source files' path, size and mtime, and the
transformers version that read them.
"""

from __future__ import annotations

import hashlib
import json
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
