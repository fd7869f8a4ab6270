"""End to end on the real embedded model: ``decoda serve --watermark FILE`` watermarks a request that
names no config, and ``/v1/watermark/detect`` finds it (ids and text) while plain text scores low."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.test_e2e_openai import start_server, stop_server

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
CONFIG = {"hashing_key": 424242, "bias": 4.0}


@pytest.fixture(scope="module")
def server(smollm2, tmp_path_factory):  # smollm2: the model is converted into the cache first
    path = tmp_path_factory.mktemp("wm") / "watermark.json"
    path.write_text(json.dumps(CONFIG))
    base, proc = start_server("--max-model-len", "512", "--watermark", str(path))
    yield base
    stop_server(proc)


def generate(base: str, **fields: object) -> dict:
    body = {"prompt": "Write a story about a lighthouse keeper.", "max_tokens": 40, "min_tokens": 40,
            "temperature": 1.0, "seed": 7, "return_token_ids": True, **fields}  # fmt: skip
    r = httpx.post(f"{base}/v1/completions", json=body, timeout=400)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def detect(base: str, **fields: object) -> dict:
    r = httpx.post(f"{base}/v1/watermark/detect", json={"z_threshold": 4.0, **fields}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_the_server_watermark_is_detected_and_plain_text_is_not(server):
    marked = generate(server)  # names no config: the server's
    found = detect(server, token_ids=marked["token_ids"])
    assert found["object"] == "watermark.detection" and found["prediction"], found
    assert found["num_tokens_scored"] == 39
    assert detect(server, text=marked["text"])["prediction"]
    other_key = generate(server, watermarking_config={"hashing_key": 1})
    plain = detect(server, token_ids=other_key["token_ids"])
    assert not plain["prediction"] and plain["z_score"] < found["z_score"]
    r = httpx.post(f"{server}/v1/watermark/detect", json={"text": "Hi"}, timeout=120)
    assert r.status_code == 400 and "at least 2 tokens" in r.json()["error"]["message"]
