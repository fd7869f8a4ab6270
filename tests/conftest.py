"""Shared fixtures: the embedded model (converted once into the user cache) and its tokenizer."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def smollm2():
    """The real embedded model with transformers' SDPA attention (the HF reference side)."""
    from decoding.model.loading import load_model

    return load_model("smollm2-135m-instruct", attn_implementation="sdpa")


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2):
    return smollm2.tokenizer
