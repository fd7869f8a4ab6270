"""Issue 11's knobs against a real server on the embedded model, through the official openai client."""

from __future__ import annotations

import openai
import pytest
import torch

from tests.shared_servers import PLAIN
from tests.test_e2e_openai import MODEL

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture(scope="module")
def client(shared_server):
    return openai.OpenAI(base_url=f"{shared_server(*PLAIN)}/v1", api_key="unused", max_retries=0)


def test_stop_strings_keep_the_text_that_stop_trims(client, smollm2):
    prompt = "1, 2, 3, 4,"
    common = dict(model=MODEL, prompt=prompt, max_tokens=20, temperature=0)
    trimmed = client.completions.create(**common, stop=[" 7"]).choices[0]
    kept = client.completions.create(**common, extra_body={"stop_strings": [" 7"]}).choices[0]
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        **common, extra_body={"stop_strings": [" 7"]}, stream=True) if c.choices)  # fmt: skip
    ids = smollm2.tokenizer.encode(prompt)
    with torch.inference_mode():
        out = smollm2.model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                     max_new_tokens=20, do_sample=False, stop_strings=[" 7"],
                                     tokenizer=smollm2.tokenizer)  # fmt: skip
    expected = smollm2.tokenizer.decode(out[0, len(ids) :], skip_special_tokens=True)
    assert kept.text == expected == streamed and " 7" in kept.text and " 7" not in trimmed.text
    assert kept.text.startswith(trimmed.text) and kept.finish_reason == trimmed.finish_reason == "stop"


def test_logits_knobs_and_lengths_over_http(client):
    prompt = "The capital of France is"
    out = client.completions.create(
        model=MODEL, prompt=prompt, temperature=0, logprobs=1,
        extra_body={"max_length": 12, "sequence_bias": [[[330], -5.0]], "renormalize_logits": True,
                    "begin_suppress_tokens": [2], "exponential_decay_length_penalty": [3, 1.05]},
    )  # fmt: skip
    assert out.usage.prompt_tokens + out.usage.completion_tokens <= 12
    assert out.choices[0].logprobs.token_logprobs and all(lp <= 0 for lp in out.choices[0].logprobs.token_logprobs)
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=MODEL, prompt=prompt, extra_body={"token_healing": True})
    assert err.value.body["param"] == "token_healing"
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=MODEL, prompt=prompt, extra_body={"forced_bos_token_id": 10**6})
    assert err.value.body["param"] == "forced_bos_token_id"
