"""Issue 11's GenerationConfig knobs through the engine equal transformers' generate() token for
token at batch size 1 (greedy, seeded sampling, beams), and alone equals in a crowd."""

from __future__ import annotations

import random

import pytest
import torch

from decoding.params import GenerationParams
from tests.engine_harness import EngineHarness, tiny_llama

EOS = 2
VOCAB = 64  # small: eos is a real candidate, so the length knobs change what is generated


@pytest.fixture(scope="module")
def model():
    return tiny_llama(VOCAB, seed=3, num_layers=2)


def prompts(count: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, VOCAB) for _ in range(rng.randrange(2, 20))] for _ in range(count)]


def hf_tokens(model, prompt: list[int], seed: int | None = None, **kwargs) -> list[int]:
    if seed is not None:
        torch.manual_seed(seed)
    kwargs.setdefault("top_k", 0)  # GenerationConfig's own default would add top_k=50
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            eos_token_id=EOS,
            pad_token_id=0,
            **kwargs,
        )
    return out[0, len(prompt) :].tolist()


def ours(model, tokenizer, prompt: list[int], **kwargs) -> list[int]:
    harness = EngineHarness(model, tokenizer, [EOS])
    harness.add("r", prompt, GenerationParams(**kwargs))
    harness.run()
    return harness.token_ids("r")


def engine_kwargs(case: dict) -> dict:
    """HF's call arguments as GenerationParams fields (tuple/list forms as the server sends them)."""
    out = dict(case)
    if "exponential_decay_length_penalty" in out:
        out["exponential_decay_length_penalty"] = tuple(out["exponential_decay_length_penalty"])
    return out


CASES = [
    dict(max_new_tokens=16, sequence_bias=[[[10], 4.0], [[11, 12], 8.0], [[12, 13], -2.5], [[40, 41, 42], 6.0]]),
    dict(max_new_tokens=24, exponential_decay_length_penalty=(3, 1.8)),
    dict(max_new_tokens=24, exponential_decay_length_penalty=(2, 2.0), min_length=14),
    dict(max_new_tokens=10, begin_suppress_tokens=list(range(3, 40))),
    dict(max_new_tokens=7, forced_eos_token_id=9),
    dict(max_new_tokens=12, renormalize_logits=True, repetition_penalty=1.3),
    dict(max_new_tokens=12, forced_bos_token_id=5),  # prompts of 2+ tokens: HF does not force it
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: ",".join(c)[:60])
def test_greedy_equals_hf_generate(model, smollm2_tokenizer, case):
    for p, prompt in enumerate(prompts(3, seed=5)):
        expected = hf_tokens(model, prompt, do_sample=False, **case)
        assert ours(model, smollm2_tokenizer, prompt, **engine_kwargs(case)) == expected, f"prompt {p}"


def test_length_knobs_count_the_prompt(model, smollm2_tokenizer):
    for p, prompt in enumerate(prompts(3, seed=6)):
        expected = hf_tokens(model, prompt, do_sample=False, max_length=len(prompt) + 5)
        assert len(expected) == 5
        got = ours(model, smollm2_tokenizer, prompt, max_length=len(prompt) + 5, max_new_tokens=99)
        assert got == expected, f"prompt {p}"
        # min_length holds eos back until the total reaches it; the decay makes eos likely right after
        case = dict(min_length=len(prompt) + 9, exponential_decay_length_penalty=(1, 3.0), max_new_tokens=30)
        expected = hf_tokens(model, prompt, do_sample=False, **case)
        assert ours(model, smollm2_tokenizer, prompt, **engine_kwargs(case)) == expected, f"prompt {p}"


def test_forced_bos_only_for_a_one_token_prompt_as_in_hf(model, smollm2_tokenizer):
    for token in (7, 30):
        case = dict(max_new_tokens=6, forced_bos_token_id=17, begin_suppress_tokens=[20, 21, 22])
        expected = hf_tokens(model, [token], do_sample=False, **case)
        assert expected[0] == 17
        assert ours(model, smollm2_tokenizer, [token], **case) == expected


SAMPLE_CASES = [
    dict(max_new_tokens=16, temperature=0.8, sequence_bias=[[[10], 2.0], [[11, 12], 3.0]], renormalize_logits=True),
    dict(max_new_tokens=20, top_p=0.9, exponential_decay_length_penalty=(2, 1.5), min_length=8),
    dict(max_new_tokens=8, top_k=10, forced_eos_token_id=[9, 11], begin_suppress_tokens=[4, 5, 6]),
]


@pytest.mark.parametrize("case", SAMPLE_CASES, ids=lambda c: ",".join(c)[:60])
def test_seeded_sampling_equals_hf_generate(model, smollm2_tokenizer, case):
    for p, prompt in enumerate(prompts(3, seed=8)):
        expected = hf_tokens(model, prompt, seed=40 + p, do_sample=True, **case)
        got = ours(model, smollm2_tokenizer, prompt, do_sample=True, seed=40 + p, **engine_kwargs(case))
        assert got == expected, f"prompt {p}"


BEAM_CASES = [
    dict(num_beams=3, max_new_tokens=10, renormalize_logits=True, sequence_bias=[[[10], 3.0]], length_penalty=0.7),
    dict(num_beams=3, max_new_tokens=10, sequence_bias=[[[10], 1.5], [[11, 12], 2.0]]),
    dict(num_beams=2, max_new_tokens=12, min_length=12, exponential_decay_length_penalty=(1, 1.5)),
    dict(num_beams=3, max_new_tokens=6, forced_eos_token_id=9, begin_suppress_tokens=[4, 5]),
]


@pytest.mark.parametrize("case", BEAM_CASES, ids=lambda c: ",".join(c)[:60])
def test_beam_search_equals_hf_generate(model, smollm2_tokenizer, case):
    for p, prompt in enumerate(prompts(3, seed=9)):
        expected = hf_tokens(model, prompt, **case)
        if EOS in expected:  # HF pads after eos; ours ends there
            expected = expected[: expected.index(EOS) + 1]
        assert ours(model, smollm2_tokenizer, prompt, **engine_kwargs(case)) == expected, f"prompt {p}"


def test_knob_requests_in_one_batch_equal_alone(model, smollm2_tokenizer):
    cases = CASES + [dict(max_new_tokens=9)]
    crowd = EngineHarness(model, smollm2_tokenizer, [EOS], max_num_batched_tokens=24)
    alone = []
    for i, (case, prompt) in enumerate(zip(cases, prompts(len(cases), seed=12), strict=True)):
        crowd.add(f"r{i}", prompt, GenerationParams(**engine_kwargs(case)))
        alone.append(ours(model, smollm2_tokenizer, prompt, **engine_kwargs(case)))
    crowd.run()
    assert [crowd.token_ids(f"r{i}") for i in range(len(cases))] == alone


def hf_scored(model, prompt: list[int], **kwargs):  # noqa: ANN201
    with torch.inference_mode():
        return model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            eos_token_id=EOS,
            pad_token_id=0,
            top_k=0,
            output_scores=True,
            return_dict_in_generate=True,
            **kwargs,
        )


def test_renormalize_logits_shows_in_logprobs_and_beam_scores(model, smollm2_tokenizer):
    prompt = prompts(1, seed=13)[0]
    knobs = dict(max_new_tokens=6, sequence_bias=[[[10], 3.0], [[11], -2.0]], renormalize_logits=True)
    out = hf_scored(model, prompt, do_sample=False, **knobs)
    harness = EngineHarness(model, smollm2_tokenizer, [EOS])
    harness.add("r", prompt, GenerationParams(**knobs, logprobs=2))
    harness.run()
    entries = [e for o in harness.outputs["r"] for d in o.deltas for e in d.logprobs or []]
    tokens = out.sequences[0, len(prompt) :].tolist()
    assert [e.token_id for e in entries] == tokens
    for entry, scores in zip(entries, out.scores, strict=True):  # HF's processed, renormalized scores
        assert entry.logprob == pytest.approx(float(scores[0, entry.token_id]), abs=1e-5)
    plain = EngineHarness(model, smollm2_tokenizer, [EOS])  # without the flag: the raw model's logprobs
    plain.add("r", prompt, GenerationParams(**{**knobs, "renormalize_logits": False}, logprobs=0))
    plain.run()
    raw = [e.logprob for o in plain.outputs["r"] for d in o.deltas for e in d.logprobs or []]
    assert raw != [e.logprob for e in entries]

    beam = dict(num_beams=3, max_new_tokens=8, sequence_bias=[[[10], 3.0]], renormalize_logits=True)
    out = hf_scored(model, prompt, **beam)
    harness = EngineHarness(model, smollm2_tokenizer, [EOS])
    harness.add("b", prompt, GenerationParams(**beam, logprobs=0))
    harness.run()
    assert harness.sequence_scores("b") == pytest.approx(out.sequences_scores.tolist(), abs=1e-4)


# ---- stop_strings: HF's StopStringCriteria; the completing tokens stay in the output ----------------------
@pytest.fixture(scope="module")
def wide_model(smollm2_tokenizer):
    return tiny_llama(len(smollm2_tokenizer), seed=1)


def spanning_stop(tokenizer, ids: list[int], at: int) -> str:
    """A stop string made of the end of token ``at`` and the start of token ``at + 1``."""
    left, right = tokenizer.decode(ids[: at + 1]), tokenizer.decode(ids[: at + 2])
    return left[-2:] + right[len(left) : len(left) + 2]


def test_stop_strings_equal_hf_and_keep_the_text(wide_model, smollm2_tokenizer):
    tokenizer = smollm2_tokenizer
    checked = 0
    for p, text in enumerate(["The capital of France is", "Once upon a time", "def add(a, b):"]):
        prompt = tokenizer.encode(text)
        free = hf_tokens(wide_model, prompt, do_sample=False, max_new_tokens=16)
        stop = spanning_stop(tokenizer, free, 4)
        if len(stop.strip()) < 3:
            continue
        expected = hf_tokens(wide_model, prompt, do_sample=False, max_new_tokens=16, stop_strings=[stop],
                             tokenizer=tokenizer)  # fmt: skip
        harness = EngineHarness(wide_model, tokenizer, [EOS])
        harness.add("hf", prompt, GenerationParams(max_new_tokens=16, stop_strings=["zzzq", stop]))
        harness.add("openai", prompt, GenerationParams(max_new_tokens=16, stop=[stop]))
        harness.run()
        assert harness.token_ids("hf") == expected and len(expected) < 16, f"prompt {p}"
        assert harness.finish_reason("hf") == "stop"
        assert harness.text("hf") == tokenizer.decode(expected)  # nothing trimmed
        assert stop in tokenizer.decode(prompt + expected)  # HF matches over the prompt too
        assert stop not in harness.text("openai") and harness.text("hf").startswith(harness.text("openai"))
        checked += 1
    assert checked >= 2


def test_stop_strings_end_beam_hypotheses_as_in_hf(wide_model, smollm2_tokenizer):
    tokenizer = smollm2_tokenizer
    prompt = tokenizer.encode("The capital of France is")
    case = dict(num_beams=3, max_new_tokens=10)
    free = hf_tokens(wide_model, prompt, **case)
    stop = spanning_stop(tokenizer, free, 3)
    expected = hf_tokens(wide_model, prompt, stop_strings=[stop], tokenizer=tokenizer, **case)
    expected = expected[: len(expected) - expected[::-1].index(next(t for t in reversed(expected) if t != 0))]
    assert ours(wide_model, tokenizer, prompt, stop_strings=[stop], **case) == expected
