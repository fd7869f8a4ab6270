"""A model's paged-attention check (``support.check_model``) remembered once it has passed.

The check runs the loaded model eleven times (a paged prefill and decode step against transformers'
eager and SDPA forwards, each prefix on its own): a few hundred milliseconds for SmolLM2, 10-40 s
for Qwen2.5-Coder-1.5B on a 2-core machine, most of a later start's time. Its verdict depends only
on the weights, the model's code and config, the dtype, and the code that computes both sides, so
a pass is recorded in the cache under a key made of all of them: the weights' source (file path,
size, mtime), the model class and config, the dtype and every module's kind (float, or which
low-bit blocks), the transformers and torch versions, and the contents of every Python and C++
file of the code both sides run through (``decoding/model``: attention, runner, kernels; and
``decoding/kv``: the paged cache). A change to any of them runs the check again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path

import torch
import transformers

from decoding.model.cache_files import made

logger = logging.getLogger(__name__)

ENGINE_ROOT = Path(__file__).resolve().parent.parent  # decoding/
CHECKED_CODE = ("model", "kv")  # the packages whose code computes both sides of the check


def record_key(model: torch.nn.Module, source_key: str) -> str:
    """Everything the check's verdict depends on, hashed."""
    digest = hashlib.sha256()
    kinds = sorted({f"{type(m).__name__}:{getattr(m, 'kind', '')}" for m in model.modules()})
    dtypes = sorted({str(p.dtype) for p in model.parameters()})
    head = [source_key, type(model).__name__, model.config.to_json_string(use_diff=False), kinds, dtypes,
            transformers.__version__, torch.__version__]  # fmt: skip
    digest.update(json.dumps(head, sort_keys=True, default=str).encode())
    files = (p for package in CHECKED_CODE for p in (ENGINE_ROOT / package).rglob("*"))
    for path in sorted(p for p in files if p.suffix in (".py", ".cpp", ".h")):
        digest.update(str(path.relative_to(ENGINE_ROOT)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:24]


def checked_once(
    check: Callable[[], None], model: torch.nn.Module, cache_root: Path, source_key: str | None, name: str
) -> None:
    """Run ``check`` unless a pass is recorded for this model, code and versions; record a pass."""
    if source_key is None:  # weights with no stable identity (a hub id): checked every start
        check()
        return
    record = cache_root / "checks" / f"{record_key(model, source_key)}.json"
    if record.is_file():
        logger.info("paged attention check: passed before for %s with this code and these versions (%s)", name, record)
        return
    check()
    tmp = made(record.parent) / f".{record.name}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps({"model": name, "source": source_key, "passed": True}))
    os.replace(tmp, record)
