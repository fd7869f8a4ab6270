"""How many bytes the paged KV cache gets: ``--kv-cache-memory`` as bytes or a share of free memory.

A fraction is taken of the memory available once the model is loaded: the kernel's
``MemAvailable``, or what the container's cgroup still allows when that is less (a pod's limit,
not the node's RAM). The pool is allocated uninitialised, so its pages become resident only as
blocks are first written; the figure bounds what the cache (prefix cache included) may grow to.
"""

from __future__ import annotations

import re
from pathlib import Path

DEFAULT_KV_CACHE_MEMORY = "0.2"
_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "kib": 2**10, "m": 10**6, "mb": 10**6, "mib": 2**20,
          "g": 10**9, "gb": 10**9, "gib": 2**30, "t": 10**12, "tb": 10**12, "tib": 2**40}  # fmt: skip


def kv_cache_bytes(spec: str | float) -> int:
    """``"0.2"`` -> a fifth of the available memory; ``"4GiB"``, ``"512MB"``, ``"1000000"`` -> bytes."""
    text = str(spec).strip().lower()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([a-z]*)", text)
    if match is None or match.group(2) not in _UNITS:
        raise ValueError(f"--kv-cache-memory must be a fraction in (0, 1] or a size such as 4GiB, got {spec!r}")
    number, unit = float(match.group(1)), match.group(2)
    if not unit and 0 < number <= 1:
        return int(number * available_memory())
    if number < 1:
        raise ValueError(f"--kv-cache-memory must be a fraction in (0, 1] or a size such as 4GiB, got {spec!r}")
    return int(number * _UNITS[unit])


def available_memory() -> int:
    """Bytes this process could still take: MemAvailable, capped by the cgroup's limit left."""
    available = _meminfo_available()
    limit = _cgroup_room()
    return min(available, limit) if limit is not None else available


def _meminfo_available() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 * 2**30  # not Linux: assume a small machine


def _cgroup_room() -> int | None:
    for limit_file, usage_file in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),  # cgroup v2
        ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),  # v1
    ):
        try:
            limit = Path(limit_file).read_text().strip()
            usage = int(Path(usage_file).read_text().strip())
        except (OSError, ValueError):
            continue
        if limit == "max" or int(limit) >= 2**60:
            return None
        return max(0, int(limit) - usage)
    return None
