"""Custom decoding methods (``custom_generate``): loading, equality with transformers, the exclusive job.

The two shipped methods (``config/custom_generate/``) must give what transformers' own
``model.generate(custom_generate=PATH, trust_remote_code=True)`` gives on the same inputs; the job
must leave the other requests of the batch intact, stream through HF's streamer interface, and
stop on a disconnect, a time limit and ``max_tokens`` even when the method ignores its criteria.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from transformers import GenerationConfig
from transformers.dynamic_module_utils import check_python_requirements

from decoding.custom.loading import load_custom_methods, preflight
from decoding.params import GenerationParams
from decoding.params.custom_methods import parse_custom_generate
from tests.engine_harness import EngineHarness, hf_greedy, tiny_llama

ROOT = Path(__file__).resolve().parent.parent
LEFT_PADDING = ROOT / "config" / "custom_generate" / "left_padding"
LOOKAHEAD = ROOT / "config" / "custom_generate" / "lookahead"
SHIPPED = [("left_padding", str(LEFT_PADDING)), ("lookahead", str(LOOKAHEAD))]
EOS = 2


def harness_with(model, tokenizer, eos: list[int], specs=SHIPPED) -> EngineHarness:
    harness = EngineHarness(model, tokenizer, eos)
    harness.engine.custom.methods.update(load_custom_methods(specs, True, harness.engine.runner.model))
    return harness


def hf_custom(model, path: Path, prompt: list[int], max_new_tokens: int, eos: list[int], **kwargs) -> list[int]:
    """transformers' own path: generate() loads the method and calls it (input_ids by keyword, as HF's docs do)."""
    config = GenerationConfig(max_new_tokens=max_new_tokens, eos_token_id=eos)
    with torch.inference_mode():
        out = model.generate(input_ids=torch.tensor([prompt]), custom_generate=str(path), trust_remote_code=True,
                             generation_config=config, **kwargs)  # fmt: skip
    ids = out[0].tolist()
    start = next(i for i in range(len(ids)) if ids[i : i + len(prompt)] == prompt)
    return ids[start + len(prompt) :]


@pytest.fixture(scope="module")
def tiny(smollm2_tokenizer):
    return tiny_llama(len(smollm2_tokenizer), seed=1)


# ---- equality with transformers' model.generate(custom_generate=...) ------------------------------------------
@pytest.mark.parametrize(
    ("name", "path", "args"),
    [
        ("left_padding", LEFT_PADDING, {"left_padding": 5}),
        ("lookahead", LOOKAHEAD, {"lookahead_top_k": 4}),
    ],
)
def test_shipped_method_equals_hf_generate_on_the_embedded_model(smollm2, name, path, args):
    tokenizer, model = smollm2.tokenizer, smollm2.model
    eos = list(smollm2.eos_token_ids)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
    args = {**args, "pad_token": pad} if name == "left_padding" else args
    harness = harness_with(model, tokenizer, eos)
    prompts = [tokenizer.encode(text) for text in ("The capital of France is", "def fibonacci(n):")]
    for i, prompt in enumerate(prompts):
        params = GenerationParams(max_new_tokens=8, custom_generate=name, custom_generate_args=args)
        harness.add(f"r{i}", prompt, params)
    harness.run()
    for i, prompt in enumerate(prompts):
        expected = hf_custom(model, path, prompt, 8, eos, **args)
        assert harness.token_ids(f"r{i}") == expected, f"prompt {i}"
        assert harness.text(f"r{i}") == tokenizer.decode(expected, skip_special_tokens=True)
        stopped = expected[-1] in eos
        assert harness.finish_reason(f"r{i}") == ("stop" if stopped else "length")


def test_the_methods_do_what_greedy_does_not(tiny, smollm2_tokenizer):
    """The arguments matter: lookahead and left padding change the tokens; lookahead_top_k=1 is greedy."""
    harness = harness_with(tiny, smollm2_tokenizer, [EOS])
    prompt = [5, 17, 300, 4000, 12]
    harness.add("look", prompt, GenerationParams(max_new_tokens=8, custom_generate="lookahead"))
    harness.add("look1", prompt, GenerationParams(max_new_tokens=8, custom_generate="lookahead",
                                                  custom_generate_args={"lookahead_top_k": 1}))  # fmt: skip
    harness.run()
    greedy = hf_greedy(tiny, prompt, 8, eos_token_id=EOS)
    assert harness.token_ids("look1") == greedy
    assert harness.token_ids("look") != greedy
    assert harness.token_ids("look") == hf_custom(tiny, LOOKAHEAD, prompt, 8, [EOS])


# ---- the exclusive job inside the engine ----------------------------------------------------------------------
def test_other_requests_resume_after_the_job_unchanged(tiny, smollm2_tokenizer):
    harness = harness_with(tiny, smollm2_tokenizer, [EOS])
    order: list[str] = []
    collect = harness.engine.emit
    harness.engine.emit = lambda out: (order.append(out.request_id), collect(out))
    prompts = {"g1": [7, 8, 9, 10], "g2": [300, 301, 302]}
    for rid, prompt in prompts.items():
        harness.add(rid, prompt, GenerationParams(max_new_tokens=12))
    for _ in range(3):  # the greedy requests are mid-decode when the job arrives
        harness.engine.step()
    custom_prompt = [11, 12, 13, 14, 15]
    harness.add("c", custom_prompt, GenerationParams(max_new_tokens=6, custom_generate="lookahead"))
    harness.run()
    for rid, prompt in prompts.items():
        assert harness.token_ids(rid) == hf_greedy(tiny, prompt, 12, eos_token_id=EOS)
    assert harness.token_ids("c") == hf_custom(tiny, LOOKAHEAD, custom_prompt, 6, [EOS])
    first, last = order.index("c"), len(order) - 1 - order[::-1].index("c")
    assert set(order[first : last + 1]) == {"c"}, "the job's outputs all came between two steps"
    streamed = [out for out in harness.outputs["c"] if out.deltas and out.deltas[0].token_ids]
    assert len(streamed) == 6, "one output per token as the method put() it"
    assert harness.outputs["c"][-1].finished
    assert harness.engine.runner.model.config._attn_implementation == "decoda"  # restored after the job


def test_a_disconnect_stops_the_running_job(tiny, smollm2_tokenizer):
    harness = harness_with(tiny, smollm2_tokenizer, [EOS])
    collect = harness.engine.emit

    def disconnect_after_two_tokens(out):  # what Worker.abort does from the event loop's thread
        collect(out)
        if len(harness.token_ids("c")) >= 2:
            harness.engine.custom.cancel("c")

    harness.engine.emit = disconnect_after_two_tokens
    harness.add("c", [11, 12, 13], GenerationParams(max_new_tokens=50, custom_generate="left_padding"))
    harness.run()
    last = harness.outputs["c"][-1]
    assert last.finished and last.error is None and harness.finish_reason("c") is None  # an abort: nobody reads it
    assert len(harness.token_ids("c")) == 2


def test_aborting_a_queued_job_ends_it_without_running_it(tiny, smollm2_tokenizer):
    harness = harness_with(tiny, smollm2_tokenizer, [EOS])
    harness.add("c", [11, 12, 13], GenerationParams(max_new_tokens=5, custom_generate="lookahead"))
    harness.engine.abort("c")
    assert not harness.engine.has_work()
    assert [(o.finished, o.deltas) for o in harness.outputs["c"]] == [(True, [])]
    # a disconnect flagged while the job was being started (its abort command not yet read) stops it at once
    harness.add("d", [11, 12, 13], GenerationParams(max_new_tokens=5, custom_generate="lookahead"))
    harness.engine.custom.cancel("d")
    harness.run()
    assert [(o.finished, o.deltas, o.error) for o in harness.outputs["d"]] == [(True, [], None)]
    harness.engine.abort("d")  # the abort command arrives after the job ended: nothing left behind
    assert not harness.engine.custom.is_cancelled("d")


STUBBORN = """
import time

import torch


def generate(model, input_ids, generation_config=None, streamer=None, delay=0.0, **kwargs):
    '''Greedy forever: it never looks at its stopping criteria.'''
    streamer.put(input_ids)
    while True:
        token = model(input_ids=input_ids).logits[:, -1, :].argmax(dim=-1)
        streamer.put(token)
        input_ids = torch.cat([input_ids, token[:, None]], dim=1)
        time.sleep(delay)
"""


def write_method(folder: Path, code: str, requirements: str | None = None) -> Path:
    (folder / "custom_generate").mkdir(parents=True)
    (folder / "custom_generate" / "generate.py").write_text(textwrap.dedent(code))
    if requirements is not None:
        (folder / "custom_generate" / "requirements.txt").write_text(requirements)
    return folder


def test_time_limit_and_max_tokens_stop_a_method_that_ignores_its_criteria(tiny, smollm2_tokenizer, tmp_path):
    path = write_method(tmp_path / "stubborn", STUBBORN)
    harness = harness_with(tiny, smollm2_tokenizer, [EOS], specs=[("stubborn", str(path))])
    args = {"delay": 0.05}
    harness.add("timed", [5, 6, 7], GenerationParams(max_new_tokens=1000, max_time=0.3, custom_generate="stubborn",
                                                     custom_generate_args=args))  # fmt: skip
    harness.add("capped", [5, 6, 7], GenerationParams(max_new_tokens=4, custom_generate="stubborn"))
    harness.run()
    assert harness.finish_reason("timed") == "length"
    assert 1 <= len(harness.token_ids("timed")) < 20
    assert harness.token_ids("capped") == hf_greedy(tiny, [5, 6, 7], 4)  # the method's greedy, cut at max_tokens
    assert harness.finish_reason("capped") == "length"


def test_a_stopping_worker_ends_the_running_job_as_unavailable(tiny, smollm2_tokenizer, tmp_path):
    path = write_method(tmp_path / "stubborn", STUBBORN)
    harness = harness_with(tiny, smollm2_tokenizer, [EOS], specs=[("stubborn", str(path))])
    collect = harness.engine.emit

    def stop_after_a_token(out):  # what Worker.stop does once the drain deadline passed
        collect(out)
        harness.engine.custom.stop()

    harness.engine.emit = stop_after_a_token
    harness.add("c", [5, 6, 7], GenerationParams(max_new_tokens=1000, custom_generate="stubborn"))
    harness.run()
    last = harness.outputs["c"][-1]
    assert last.finished and last.error_code == "unavailable" and "retry" in last.error


def test_a_method_raising_on_its_arguments_fails_only_that_request(tiny, smollm2_tokenizer):
    harness = harness_with(tiny, smollm2_tokenizer, [EOS])
    harness.add("bad", [5, 6], GenerationParams(max_new_tokens=4, custom_generate="lookahead",
                                                custom_generate_args={"lookahead_top_k": 0}))  # fmt: skip
    harness.add("ok", [5, 6], GenerationParams(max_new_tokens=4))
    harness.run()
    bad = harness.outputs["bad"][-1]
    assert bad.error_code == "invalid_request" and "lookahead_top_k must be an integer in [1, 64]" in bad.error
    assert harness.token_ids("ok") == hf_greedy(tiny, [5, 6], 4, eos_token_id=EOS)


# ---- loading: the trust gate and transformers' requirement check ------------------------------------------------
def test_loading_code_needs_trust_remote_code(tiny):
    with pytest.raises(ValueError, match="--trust-remote-code"):
        load_custom_methods(SHIPPED, False, tiny)
    with pytest.raises(ValueError, match="custom_generate/generate.py does not exist"):
        preflight([("nothing", "/nonexistent")], True)


def test_unmet_requirements_fail_with_transformers_wording(tmp_path):
    path = write_method(tmp_path / "needy", STUBBORN, "decoda-surely-absent-package>=1.0\ntorch>=999\n# a comment\n")
    with pytest.raises(ImportError) as ours:
        preflight([("needy", str(path))], True)
    with pytest.raises(ImportError) as theirs:  # transformers' own check, the wording users know
        check_python_requirements(str(path.resolve()), requirements_file="custom_generate/requirements.txt")
    assert str(ours.value) == f"--custom-generate needy={path}: {theirs.value}"
    assert "Missing requirements in your local environment for" in str(ours.value)
    assert "decoda-surely-absent-package>=1.0 (installed: None)" in str(ours.value)
    assert f"torch>=999 (installed: {torch.__version__.split('+')[0]}" in str(ours.value)


def test_methods_describe_the_arguments_a_request_may_set(tiny):
    methods = load_custom_methods(SHIPPED, True, tiny)
    assert methods["left_padding"].info.arguments == ("left_padding", "pad_token")
    assert methods["lookahead"].info.arguments == ("lookahead_top_k",)
    assert parse_custom_generate(" a=x , b=y ") == [("a", "x"), ("b", "y")]
    with pytest.raises(ValueError, match="NAME=PATH"):
        parse_custom_generate("no-name")


def serve(*flags: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "server.cli", "serve", "--port", "0", *flags]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_the_server_refuses_to_start_without_trust_remote_code():
    done = serve("--custom-generate", f"left_padding={LEFT_PADDING}")
    assert done.returncode == 2
    assert "start the server with --trust-remote-code" in done.stderr


def test_the_server_refuses_to_start_with_unmet_requirements(tmp_path):
    path = write_method(tmp_path / "needy", STUBBORN, "decoda-surely-absent-package>=1.0\n")
    done = serve("--custom-generate", f"needy={path}", "--trust-remote-code")
    assert done.returncode != 0
    output = done.stdout + done.stderr
    assert f"Missing requirements in your local environment for `{path}`" in output
    assert "decoda-surely-absent-package>=1.0 (installed: None)" in output
