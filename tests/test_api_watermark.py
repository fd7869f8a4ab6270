"""HTTP: ``watermarking_config`` on generation requests, the server's ``--watermark`` default, and
``POST /v1/watermark/detect`` (fake engine: a 100-word vocabulary), whose numbers equal transformers'
``WatermarkDetector`` on the same ids."""

from __future__ import annotations

import json
import random

import httpx
import pytest
import torch
from transformers import LlamaConfig, WatermarkDetector
from transformers import WatermarkingConfig as HFWatermarkingConfig

from decoding.params.watermarking import WatermarkingConfig
from server.config.sources import load_settings
from tests.fake_engine import WORDS, FakeEngineClient
from tests.test_api import MODEL, client_for, error_of, post, run

DETECT = "/v1/watermark/detect"
VOCAB = len(WORDS)
FIELDS = {"object", "num_tokens_scored", "num_green_tokens", "green_fraction", "z_score", "p_value", "prediction"}


def server_file(tmp_path, config: dict) -> str:
    path = tmp_path / "watermark.json"
    path.write_text(json.dumps(config))
    return str(path)


# ---- generation requests -------------------------------------------------------------------------------
def test_the_request_config_reaches_the_engine_with_hf_defaults():
    engine = FakeEngineClient()
    body = {"model": MODEL, "prompt": "hi", "watermarking_config": {"bias": 3, "seeding_scheme": "selfhash"}}
    assert run(post(engine, "/v1/completions", body)).status_code == 200
    assert engine.submitted[0][2].watermarking_config == WatermarkingConfig(bias=3.0, seeding_scheme="selfhash")
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "watermarking_config": {}}
    assert run(post(engine, "/v1/chat/completions", body)).status_code == 200
    assert engine.submitted[1][2].watermarking_config == WatermarkingConfig()
    run(post(engine, "/v1/completions", {"model": MODEL, "prompt": "hi"}))
    assert engine.submitted[2][2].watermarking_config is None  # no server default: no watermark


@pytest.mark.parametrize(
    ("config", "param", "words"),
    [
        ({"greenlist_ratio": 1.5}, "watermarking_config.greenlist_ratio", "must be in (0, 1), got 1.5"),
        ({"seeding_scheme": "x"}, "watermarking_config.seeding_scheme", '"lefthash" or "selfhash"'),
        ({"context_width": 0}, "watermarking_config.context_width", "must be in [1, 1024], got 0"),
        ({"bias": "big"}, "watermarking_config.bias", "must be a number"),
        ({"gamma": 0.25}, "watermarking_config.gamma", "unknown field 'gamma'"),
        ("lefthash", "watermarking_config", "must be an object"),
    ],
)
def test_bad_configs_are_400s_naming_the_field(config, param, words):
    for path, body in (
        ("/v1/completions", {"model": MODEL, "prompt": "hi"}),
        (DETECT, {"model": MODEL, "token_ids": [1, 2, 3]}),
    ):
        r = run(post(FakeEngineClient(), path, {**body, "watermarking_config": config}))
        assert r.status_code == 400, (path, r.text)
        error = error_of(r)
        assert error["param"] == param and words in error["message"], (path, error)


def test_the_server_default_watermarks_requests_that_name_none(tmp_path):
    engine = FakeEngineClient()
    path = server_file(tmp_path, {"hashing_key": 42, "bias": 1.5})
    run(post(engine, "/v1/completions", {"model": MODEL, "prompt": "hi"}, watermark=path))
    assert engine.submitted[0][2].watermarking_config == WatermarkingConfig(hashing_key=42, bias=1.5)
    body = {"model": MODEL, "prompt": "hi", "watermarking_config": {"hashing_key": 7}}
    run(post(engine, "/v1/completions", body, watermark=path))
    assert engine.submitted[1][2].watermarking_config == WatermarkingConfig(hashing_key=7)  # request wins


def test_a_bad_watermark_file_stops_the_server_naming_file_and_field(tmp_path):
    path = server_file(tmp_path, {"greenlist_ratio": 0})
    with pytest.raises(ValueError, match=r"watermark\.json: watermarking_config\.greenlist_ratio must be in \(0, 1\)"):
        load_settings(environ={"DECODA_WATERMARK": path})
    good = server_file(tmp_path, {"seeding_scheme": "selfhash"})
    assert load_settings(environ={"DECODA_WATERMARK": good}).watermark == good


# ---- detection --------------------------------------------------------------------------------------------
def hf_detect(config: WatermarkingConfig, ids: list[int], **kwargs):  # the fake model has no BOS: HF needs one
    detector = WatermarkDetector(LlamaConfig(vocab_size=VOCAB, bos_token_id=-1), "cpu",
                                 HFWatermarkingConfig(**config.to_dict()),
                                 ignore_repeated_ngrams=kwargs.pop("ignore_repeated_ngrams", False))  # fmt: skip
    return detector(torch.tensor([ids]), return_dict=True, **kwargs)


@pytest.mark.parametrize("seeding_scheme", ["lefthash", "selfhash"])
@pytest.mark.parametrize("ignore_repeated_ngrams", [False, True])
def test_detect_equals_hf_watermark_detector(seeding_scheme, ignore_repeated_ngrams):
    config = WatermarkingConfig(seeding_scheme=seeding_scheme, context_width=2, hashing_key=11)
    rng = random.Random(3)
    ids = [rng.randrange(VOCAB) for _ in range(40)] + [5, 6] * 5
    body = {"model": MODEL, "token_ids": ids, "watermarking_config": config.to_dict(), "z_threshold": 1.0,
            "ignore_repeated_ngrams": ignore_repeated_ngrams}  # fmt: skip
    r = run(post(FakeEngineClient(), DETECT, body))
    assert r.status_code == 200, r.text
    got = r.json()
    assert set(got) == FIELDS and got["object"] == "watermark.detection"
    hf = hf_detect(config, ids, z_threshold=1.0, ignore_repeated_ngrams=ignore_repeated_ngrams)
    assert got["num_tokens_scored"] == hf.num_tokens_scored[0]
    assert got["num_green_tokens"] == hf.num_green_tokens[0]
    assert got["green_fraction"] == pytest.approx(hf.green_fraction[0], abs=1e-12)
    assert got["z_score"] == pytest.approx(hf.z_score[0], abs=1e-4)
    assert got["p_value"] == pytest.approx(hf.p_value[0], abs=1e-6)
    assert got["prediction"] == bool(hf.prediction[0])


def test_detect_tokenizes_text_and_uses_the_server_default(tmp_path):
    text = "hello world foo bar baz the end w1 w2 w3"
    ids = FakeEngineClient()._words(text)
    path = server_file(tmp_path, {"hashing_key": 5})
    r = run(post(FakeEngineClient(), DETECT, {"text": text}, watermark=path))
    assert r.status_code == 200, r.text
    hf = hf_detect(WatermarkingConfig(hashing_key=5), ids)
    assert r.json()["z_score"] == pytest.approx(hf.z_score[0], abs=1e-4)
    assert r.json()["num_tokens_scored"] == len(ids) - 1


def test_too_short_is_a_400_saying_how_many_tokens_are_needed():
    body = {"text": "hello world", "watermarking_config": {"context_width": 2}}
    r = run(post(FakeEngineClient(), DETECT, body))
    assert r.status_code == 400
    error = error_of(r)
    assert error["param"] == "text" and error["code"] == "too_short"
    assert "needs at least 3 tokens" in error["message"] and "got 2" in error["message"]
    r = run(post(FakeEngineClient(), DETECT, {"token_ids": [4], "watermarking_config": {}}))
    assert error_of(r)["param"] == "token_ids" and "at least 2 tokens" in error_of(r)["message"]


@pytest.mark.parametrize(
    ("body", "status", "param", "words"),
    [
        ({"token_ids": [1, 2, 3]}, 400, "watermarking_config", "no default watermark"),
        ({"watermarking_config": {}}, 400, "token_ids", "exactly one of token_ids and text"),
        ({"token_ids": [1, 2], "text": "a b", "watermarking_config": {}}, 400, "token_ids", "exactly one"),
        ({"token_ids": [1, VOCAB], "watermarking_config": {}}, 400, "token_ids", f"token id {VOCAB}, outside"),
        ({"token_ids": [1] * 65, "watermarking_config": {}}, 400, "token_ids", "has 65 tokens; at most 64"),
        ({"token_ids": [1, 2, 3], "watermarking_config": {}, "z_threshold": "3"}, 400, "z_threshold", ""),
        ({"token_ids": [1, 2, 3], "watermarking_config": {}, "extra": 1}, 400, "extra", "Unrecognized"),
        ({"model": "other", "token_ids": [1, 2, 3], "watermarking_config": {}}, 404, "model", "does not exist"),
    ],
)
def test_detect_errors_name_the_field(body, status, param, words):
    r = run(post(FakeEngineClient(), DETECT, body))
    assert r.status_code == status, r.text
    error = error_of(r)
    assert error["param"] == param and words in error["message"], error


def test_detect_is_behind_the_api_key_and_in_openapi():
    body = {"token_ids": [1, 2, 3], "watermarking_config": {}}
    assert run(post(FakeEngineClient(), DETECT, body, api_key="k")).status_code == 401

    async def go() -> tuple[httpx.Response, dict]:
        async with client_for(FakeEngineClient(), api_key="k") as http:
            auth = {"Authorization": "Bearer k"}
            doc = (await http.get("/openapi.json", headers=auth)).json()
            return await http.post(DETECT, json=body, headers=auth), doc

    answer, doc = run(go())
    assert answer.status_code == 200
    operation = doc["paths"][DETECT]["post"]
    assert {"200", "400", "401", "404", "413", "429", "500", "503"} <= set(operation["responses"])
    assert "422" not in operation["responses"] and operation["security"] == [{"bearer": []}]
    config = doc["components"]["schemas"]["WatermarkingConfigBody"]["properties"]
    assert config["greenlist_ratio"]["exclusiveMinimum"] == 0 and config["greenlist_ratio"]["exclusiveMaximum"] == 1
    assert config["seeding_scheme"]["enum"] == ["lefthash", "selfhash"]
