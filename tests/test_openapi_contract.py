"""``/openapi.json`` states the real contract, and schemathesis holds a live server to it.

The fast tests read the document an app serves (fake engine): no 422, every error status with
OpenAI's body, the ranges ``validate`` enforces, the served names and the model's limits. The
slow one starts ``decoda serve`` on a tiny random model (fast generations, a short context, an
API key) and runs schemathesis with all its checks; settings in ``tests/contract/schemathesis.toml``.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from decoding import GenerationParams, ParameterError
from decoding.params import BOUNDS, validate
from tests.fake_engine import FakeEngineClient
from tests.test_api import MODEL, client_for, run
from tests.test_e2e_openai import start_server, stop_server
from tests.test_loading import _tiny_tokenizer

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "tests" / "contract" / "schemathesis.toml"
SCHEMATHESIS = shutil.which("schemathesis", path=str(Path(sys.executable).parent)) or shutil.which("schemathesis")
KEY = "contract-key"
GENERATION = ("/v1/completions", "/v1/chat/completions")


def openapi(headers: dict | None = None, **settings: object) -> dict:
    async def go() -> dict:
        async with client_for(FakeEngineClient(), **settings) as http:
            return (await http.get("/openapi.json", headers=headers)).json()

    return run(go())


def non_null(prop: dict) -> dict:
    (branch,) = [b for b in prop.get("anyOf", [prop]) if b.get("type") != "null"]
    return branch


def test_every_error_status_is_documented_with_openais_body_and_no_422():
    doc = openapi()
    for path in GENERATION:
        responses = doc["paths"][path]["post"]["responses"]
        assert "422" not in responses
        assert {"200", "400", "401", "404", "413", "429", "500", "503"} <= set(responses)
        for status in ("400", "401", "404", "413", "429", "500", "503"):
            schema = responses[status]["content"]["application/json"]["schema"]
            assert schema == {"$ref": "#/components/schemas/ErrorResponse"}
        assert "Retry-After" in responses["429"]["headers"] and "Retry-After" in responses["503"]["headers"]
        assert "text/event-stream" in responses["200"]["content"]
        assert "num_beam_groups" in doc["paths"][path]["post"]["description"]  # the cross-field rules
    error = doc["components"]["schemas"]["ErrorBody"]
    assert set(error["required"]) == {"message", "type", "param", "code"}
    assert "HTTPValidationError" not in doc["components"]["schemas"]
    assert "text/plain" in doc["paths"]["/metrics"]["get"]["responses"]["200"]["content"]
    assert set(doc["paths"]["/ready"]["get"]["responses"]) == {"200", "503"}


def test_ranges_names_and_limits_are_the_served_models():
    engine = FakeEngineClient()
    doc = openapi()
    props = doc["components"]["schemas"]["CompletionRequest"]["properties"]
    assert non_null(props["top_p"]) == {"type": "number", "exclusiveMinimum": 0, "maximum": 1}
    assert non_null(props["temperature"])["maximum"] == 100
    assert non_null(props["max_tokens"]) == {"type": "integer", "minimum": 1, "maximum": engine.facts.max_model_len}
    assert non_null(props["model"])["enum"] == [MODEL]
    assert non_null(props["n"])["maximum"] <= engine.facts.max_num_seqs
    assert non_null(props["stop_token_ids"])["items"]["maximum"] == engine.facts.vocab_size - 1
    assert non_null(props["logit_bias"])["additionalProperties"] == {"type": "number", "minimum": -100, "maximum": 100}
    chat = doc["components"]["schemas"]["ChatCompletionRequest"]
    assert "messages" in chat["required"] and non_null(chat["properties"]["messages"])["minItems"] == 1
    assert non_null(chat["properties"]["top_logprobs"]) == {"type": "integer", "minimum": 0, "maximum": 20}


def test_a_keyed_server_declares_bearer_auth_on_the_api_only():
    doc = openapi({"Authorization": "Bearer k1"}, api_key="k1")  # behind the key itself (no --public-docs)
    assert doc["components"]["securitySchemes"] == {"bearer": {"type": "http", "scheme": "bearer"}}
    assert doc["paths"]["/v1/completions"]["post"]["security"] == [{"bearer": []}]
    assert "security" not in doc["paths"]["/health"]["get"]


GENERATION_NAMES = {"max_tokens": "max_new_tokens", "min_tokens": "min_new_tokens"}
EXAMPLE_OTHERS = {  # what makes the knob apply, so only its bound decides
    "top_p": {"do_sample": True}, "top_k": {"do_sample": True}, "min_p": {"do_sample": True},
    "typical_p": {"do_sample": True}, "epsilon_cutoff": {"do_sample": True}, "eta_cutoff": {"do_sample": True},
    "max_matching_ngram_size": {"prompt_lookup_num_tokens": 3}, "num_assistant_tokens": {"assistant_early_exit": 1},
    "assistant_confidence_threshold": {"assistant_early_exit": 1}, "num_beam_groups": {"num_beams": 4},
    "n": {}, "penalty_alpha": {"top_k": 4},
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(set(BOUNDS) - {"logit_bias"}))
def test_the_documented_bounds_are_the_enforced_ones(name):
    """Each BOUNDS entry, which /openapi.json publishes: its edge values pass validate, one step
    past them is a 400 naming the field."""
    bounds = BOUNDS[name]
    field = GENERATION_NAMES.get(name, name)
    others = {**EXAMPLE_OTHERS.get(name, {}), "max_new_tokens": 64, "num_beams": 4 if name == "num_beam_groups" else 1}
    integer = (isinstance(getattr(GenerationParams(), field), int) or name == "seed") and name not in ("max_time",)
    step = 1 if integer else 1e-6
    edges = []
    if bounds.low is not None:
        edges.append((bounds.low + step, bounds.low) if bounds.low_open else (bounds.low, bounds.low - step))
    if bounds.high is not None:
        edges.append((bounds.high - step, bounds.high) if bounds.high_open else (bounds.high, bounds.high + step))
    for inside, outside in edges:
        if name == "num_beam_groups":
            others["num_beams"] = max(4, int(inside))
        validate(GenerationParams(**{**others, field: inside}))
        with pytest.raises(ParameterError) as refused:
            validate(GenerationParams(**{**others, field: outside}))
        assert refused.value.param == name


# ---- schemathesis against a live server ------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_model_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random Llama (vocab 16) with a word-level tokenizer and a chat template: every request,
    whatever schemathesis sends, generates in milliseconds."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=16, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128,
                         bos_token_id=1, eos_token_id=2)  # fmt: skip
    folder = tmp_path_factory.mktemp("contract") / "tiny"
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer = _tiny_tokenizer()
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}</s>{% endfor %}"
    tokenizer.save_pretrained(folder)
    return folder


@pytest.mark.e2e
@pytest.mark.skipif(SCHEMATHESIS is None, reason="schemathesis is not installed (pip install -e '.[test]')")
def test_schemathesis_with_all_checks_passes_against_a_live_server(tiny_model_folder, tmp_path):
    base, proc = start_server("--model", str(tiny_model_folder), "--max-model-len", "64", "--max-num-seqs", "4",
                              "--api-key", KEY, "--num-threads", "1", "--responses-store", f"sqlite:///{tmp_path}/responses.db",
                              log=tmp_path / "server.log")  # fmt: skip
    try:
        result = subprocess.run(
            [SCHEMATHESIS, "--config-file", str(CONFIG), "run", f"{base}/openapi.json",
             "-H", f"Authorization: Bearer {KEY}", "--checks", "all", "--max-examples", "40", "--workers", "1",
             "--seed", "20261123", "--request-timeout", "30", "--max-response-time", "20"],
            cwd=tmp_path, capture_output=True, text=True, timeout=900,
        )  # fmt: skip
    finally:
        stop_server(proc)
    summary = result.stdout[result.stdout.find("SUMMARY") :] if "SUMMARY" in result.stdout else result.stdout[-3000:]
    print(summary)
    assert result.returncode == 0, result.stdout[-8000:] + result.stderr[-2000:]
    async def operations() -> int:  # every route the spec documents (routes grow with features)
        async with client_for(FakeEngineClient()) as http:
            spec = (await http.get("/openapi.json")).json()
        return sum(len(methods) for methods in spec["paths"].values())

    assert f"Tested: {run(operations())}" in result.stdout
