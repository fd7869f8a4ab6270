"""A tiny model of another family served by ``decoda serve``: what ``/v1/models`` says about it, and
chat without a template (400) or with ``--chat-template FILE`` (served)."""

from __future__ import annotations

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.arch_families import BY_TYPE
from tests.test_e2e_openai import start_servers, stop_server

TEMPLATE = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}<|assistant|>"


@pytest.fixture(scope="module")
def folder(tmp_path_factory, smollm2_tokenizer):
    """Gemma 2 (soft-capping, sliding layers) with SmolLM2's tokenizer, whole vocabulary, stripped of its
    chat template."""
    path = tmp_path_factory.mktemp("gemma2")
    config = BY_TYPE["gemma2"].config()
    config.vocab_size = len(smollm2_tokenizer)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    tokenizer = smollm2_tokenizer.__class__.from_pretrained(smollm2_tokenizer.name_or_path)
    tokenizer.chat_template = None
    tokenizer.save_pretrained(path)
    (path / "chat_template.jinja").unlink(missing_ok=True)
    return path


def chat(base: str) -> httpx.Response:
    body = {"model": "gemma2", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    return httpx.post(f"{base}/v1/chat/completions", json=body, timeout=60)


def test_models_reports_the_architecture_and_a_base_model_gets_a_chat_template_from_a_file(folder, tmp_path):
    template = tmp_path / "template.jinja"
    template.write_text(TEMPLATE)
    # both servers start side by side (each load and warm-up is mostly one core's work)
    (base, proc), (templated, templated_proc) = start_servers(
        ("--model", str(folder), "--served-model-name", "gemma2", "--quantization", "int8", "--max-model-len", "128"),
        ("--model", str(folder), "--served-model-name", "gemma2", "--chat-template", str(template),
         "--max-model-len", "128"),
    )  # fmt: skip
    try:
        (entry,) = httpx.get(f"{base}/v1/models").json()["data"]
        assert entry["id"] == "gemma2" and entry["architecture"] == "Gemma2ForCausalLM"
        assert entry["model_type"] == "gemma2" and entry["context_length"] == entry["max_model_len"] == 128
        assert entry["dtype"] == "float32" and entry["quantization"] == "int8"
        refused = chat(base)
        assert refused.status_code == 400 and "chat template" in refused.json()["error"]["message"]
        completion = httpx.post(f"{base}/v1/completions", json={"prompt": "hi", "max_tokens": 3}, timeout=60)
        assert completion.status_code == 200 and completion.json()["usage"]["completion_tokens"] == 3
        answer = chat(templated)
        assert answer.status_code == 200, answer.text
        assert answer.json()["usage"]["prompt_tokens"] > 3
    finally:
        stop_server(proc)
        stop_server(templated_proc)
