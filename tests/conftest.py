"""Shared fixtures: the embedded model (converted once into the user cache), its tokenizer, and the
end-to-end servers modules share (``tests/shared_servers.py``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.shared_servers import SharedServers


@pytest.fixture(scope="session")
def smollm2():
    """The real embedded model with transformers' SDPA attention (the HF reference side)."""
    from decoding.model.loading import load_model

    return load_model("smollm2-135m-instruct", attn_implementation="sdpa")


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2):
    return smollm2.tokenizer


@pytest.fixture(scope="session")
def shared_server(smollm2, tmp_path_factory) -> Iterator[Callable[..., str]]:
    """``shared_server(*flags)``: the base URL of the session's one ``decoda serve`` with ``flags``,
    started on first use, stopped at the session's end. smollm2: the model is converted into the
    cache before any server starts."""
    servers = SharedServers(tmp_path_factory.mktemp("shared-servers"))
    yield servers.base_url
    servers.stop_all()
