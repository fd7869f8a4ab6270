"""Classifier-free guidance over HTTP: the fields reach the engine as ids, bad values are 400s naming them."""

from __future__ import annotations

import pytest

from tests.fake_engine import FakeEngineClient
from tests.test_api import MODEL, error_of, post, run


def submitted_params(body: dict, path: str = "/v1/completions"):  # noqa: ANN201
    engine = FakeEngineClient()
    base = {"prompt": "hello world"} if path == "/v1/completions" else {"messages": [{"role": "user", "content": "hi"}]}
    r = run(post(engine, path, {"model": MODEL, "max_tokens": 2, **base, **body}))
    assert r.status_code == 200, r.text
    return engine.submitted[0][2]


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_negative_prompt_text_is_tokenized_into_ids(path):
    params = submitted_params({"guidance_scale": 2, "negative_prompt": "foo bar"}, path)
    assert params.guidance_scale == 2 and params.negative_prompt is None
    assert params.negative_prompt_ids == [3, 4]  # the fake tokenizer's ids for "foo bar"


def test_negative_prompt_ids_and_plain_guidance_reach_the_engine():
    params = submitted_params({"guidance_scale": 1.5, "negative_prompt_ids": [5, 6]})
    assert params.negative_prompt_ids == [5, 6]
    params = submitted_params({"guidance_scale": 3.0, "temperature": 0.7, "seed": 1})
    assert params.negative_prompt_ids is None and params.do_sample


@pytest.mark.parametrize(
    ("body", "param", "fragment"),
    [
        ({"guidance_scale": 0}, "guidance_scale", "guidance_scale must be in (0, 100], got 0"),
        ({"guidance_scale": -1.5}, "guidance_scale", "got -1.5"),
        ({"guidance_scale": 101}, "guidance_scale", "(0, 100]"),
        ({"guidance_scale": "2"}, "guidance_scale", ""),
        ({"negative_prompt": "foo"}, "negative_prompt", "needs guidance_scale other than 1, got None"),
        ({"negative_prompt_ids": [3], "guidance_scale": 1}, "negative_prompt_ids", "got 1"),
        ({"guidance_scale": 2, "negative_prompt": "foo", "negative_prompt_ids": [3]}, "negative_prompt", "not both"),
        ({"guidance_scale": 2, "negative_prompt_ids": []}, "negative_prompt_ids", "must not be empty"),
        ({"guidance_scale": 2, "negative_prompt": ""}, "negative_prompt", "must not be empty"),
        ({"guidance_scale": 2, "negative_prompt": "   "}, "negative_prompt", "no tokens"),
        ({"guidance_scale": 2, "negative_prompt_ids": [100]}, "negative_prompt_ids", "outside the vocabulary"),
        (
            {"guidance_scale": 2, "negative_prompt_ids": [3] * 60, "max_tokens": 8},
            "negative_prompt_ids",
            "maximum context length is 64",
        ),
        ({"guidance_scale": 2, "custom_generate": "x"}, "guidance_scale", "custom_generate"),
        ({"guidance_scale": 2, "n": 9}, "n", "needs 18 rows"),  # each row's twin: 18 > --max-num-seqs 16
        ({"guidance_scale": 2, "num_beams": 2}, "guidance_scale", "not with beam_sample decoding"),
        ({"guidance_scale": 2, "penalty_alpha": 0.5, "top_k": 4, "temperature": 0}, "guidance_scale", "contrastive"),
        ({"guidance_scale": 2, "dola_layers": "high"}, "guidance_scale", "dola"),
        ({"guidance_scale": 2, "prompt_lookup_num_tokens": 3}, "guidance_scale", "assisted"),
    ],
)
def test_bad_guidance_values_are_400s_naming_the_field(body, param, fragment):
    r = run(post(FakeEngineClient(), "/v1/completions", {"model": MODEL, "prompt": "hello", **body}))
    assert r.status_code == 400, r.text
    assert error_of(r)["param"] == param
    assert fragment in error_of(r)["message"]


def test_guidance_scale_one_is_hf_s_off_switch():
    # HF adds no processor at 1 (the mix is the identity); the request is plain greedy
    params = submitted_params({"guidance_scale": 1, "temperature": 0})
    assert params.guidance_scale == 1
