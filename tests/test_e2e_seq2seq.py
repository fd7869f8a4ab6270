"""Encoder-decoder text models served end to end: ``decoda serve --model FOLDER`` on a Bart, a Marian and a T5
folder (tiny random models with a word-level tokenizer, saved as transformers saves them), answered
through the real ``openai`` client on ``/v1/completions`` (the prompt is the encoder's input) exactly as
``generate()`` answers on the same folder; what does not apply to such a model is a 400 naming the field.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, PreTrainedTokenizerFast

from tests.shared_servers import SharedServers
from tests.test_engine_seq2seq import tiny_bart, tiny_marian, tiny_t5

pytestmark = pytest.mark.e2e

PROMPT = "w5 w9 w33 w2 w7 w40 w41 </s>"


def save_folder(model: torch.nn.Module, folder: Path) -> Path:
    """``model`` and a word-level tokenizer over its vocabulary, as ``save_pretrained`` writes them."""
    words = ["<s>", "<pad>", "</s>", "<unk>"] + [f"w{i}" for i in range(model.config.vocab_size - 4)]
    tokenizer = Tokenizer(models.WordLevel({word: i for i, word in enumerate(words)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   unk_token="<unk>")  # fmt: skip
    for config in (model.config, model.generation_config):
        config.forced_bos_token_id = config.forced_eos_token_id = None
    model.save_pretrained(folder)
    fast.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """name -> (base URL, folder) for a Bart, a Marian and a T5 server."""
    root = tmp_path_factory.mktemp("seq2seq")
    servers = SharedServers(root)
    try:
        out = {}
        for name, build in (("bart", tiny_bart), ("marian", tiny_marian), ("t5", tiny_t5)):
            folder = save_folder(build(), root / name)
            out[name] = (servers.base_url("--model", str(folder), "--max-model-len", "64"), folder)
        yield out
    finally:
        servers.stop_all()


def reference(folder: Path, **kwargs: object) -> list[str]:
    """``generate()``'s answers on the folder itself, decoded as the server decodes them."""
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
    ids = tokenizer(PROMPT, return_tensors="pt").input_ids
    with torch.inference_mode():
        out = model.generate(ids, max_new_tokens=12, **kwargs)
    return tokenizer.batch_decode(out[:, 1:], skip_special_tokens=True)


@pytest.mark.parametrize("name", ["bart", "marian", "t5"])
def test_completions_equal_generate_greedy_and_beams(served, name):
    base, folder = served[name]
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
    (entry,) = httpx.get(f"{base}/v1/models").json()["data"]
    assert entry["task"] == "text2text-generation" and entry["max_model_len"] == 64
    greedy = client.completions.create(model=entry["id"], prompt=PROMPT, max_tokens=12, temperature=0)
    assert [greedy.choices[0].text.strip()] == [t.strip() for t in reference(folder, do_sample=False)]
    assert greedy.usage.prompt_tokens == len(PROMPT.split()) + 1  # the encoder's tokens and the decoder's start
    beams = client.completions.create(model=entry["id"], prompt=PROMPT, max_tokens=12, n=2,
                                      extra_body={"num_beams": 3, "do_sample": False})  # fmt: skip
    expected = reference(folder, do_sample=False, num_beams=3, num_return_sequences=2)
    assert [c.text.strip() for c in sorted(beams.choices, key=lambda c: c.index)] == [t.strip() for t in expected]
    streamed = client.completions.create(model=entry["id"], prompt=PROMPT, max_tokens=12, temperature=0, stream=True)
    assert "".join(chunk.choices[0].text for chunk in streamed if chunk.choices) == greedy.choices[0].text


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"dola_layers": "high"}, "dola_layers"),
        ({"prompt_lookup_num_tokens": 3}, "prompt_lookup_num_tokens"),
        ({"guidance_scale": 1.5}, "guidance_scale"),
        ({"logprobs": 1, "echo": True}, "prompt_logprobs"),
        ({"prompt": " ".join(["w7"] * 200)}, "prompt"),
    ],
)
def test_what_does_not_apply_is_a_400_naming_it(served, body, param):
    base, _ = served["bart"]
    reply = httpx.post(f"{base}/v1/completions", json={"prompt": PROMPT, "max_tokens": 4, **body}, timeout=30)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == param
