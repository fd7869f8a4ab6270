"""Speculative decoding: every proposer gives exactly the target's own output, alone and batched."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import GenerationConfig
from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

from decoding.engine.core import Engine
from decoding.params import GenerationParams
from decoding.strategies.speculative import DraftLength, propose_prompt_lookup
from decoding.telemetry import EngineObserver
from tests.engine_harness import EngineHarness, as_served, tiny_llama

EOS = 2
VOCAB = 64


class Counting(EngineObserver):
    def __init__(self) -> None:
        self.drafted: dict[str, int] = {}
        self.accepted: dict[str, int] = {}

    def on_speculation(self, proposer: str, num_drafted: int, num_accepted: int) -> None:
        self.drafted[proposer] = self.drafted.get(proposer, 0) + num_drafted
        self.accepted[proposer] = self.accepted.get(proposer, 0) + num_accepted


@pytest.fixture(scope="module")
def model():
    return tiny_llama(VOCAB, seed=3, num_layers=4)


@pytest.fixture(scope="module")
def stranger():
    """Same vocabulary, different weights: an assistant that rarely agrees with the target."""
    return tiny_llama(VOCAB, seed=99, num_layers=2)


def harness(model, tokenizer, assistants=None, **kwargs) -> tuple[EngineHarness, Counting]:
    h = EngineHarness(model, tokenizer, [EOS], **kwargs)
    if assistants:  # rebuild the engine with the assistants preloaded, as launch.py does
        h.engine = Engine(
            h.engine.runner.model, tokenizer, [EOS], h.engine.limits, h._collect, torch.device("cpu"),
            assistants={
                name: (as_served(m[0]), *m[1:]) if isinstance(m, tuple) else as_served(m)
                for name, m in assistants.items()
            },
        )  # fmt: skip
    counting = Counting()
    h.engine.ctx.observer = counting
    return h, counting


def prompts(count: int, seed: int = 0, repeat: int = 2) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, VOCAB) for _ in range(rng.randrange(4, 20))] * repeat for _ in range(count)]


SPECULATIVE = [
    {"prompt_lookup_num_tokens": 5},
    {"prompt_lookup_num_tokens": 3, "max_matching_ngram_size": 1},
    {"assistant_early_exit": 2},
    {"assistant_early_exit": 1, "num_assistant_tokens": 3, "num_assistant_tokens_schedule": "constant"},
    {"assistant_model": "self"},
    {"assistant_model": "stranger", "num_assistant_tokens_schedule": "heuristic_transient"},
]


@pytest.mark.parametrize("knobs", SPECULATIVE, ids=lambda k: ",".join(f"{a}={b}" for a, b in k.items()))
def test_greedy_output_is_plain_greedy(model, stranger, smollm2_tokenizer, knobs):
    h, counting = harness(model, smollm2_tokenizer, {"self": model, "stranger": stranger})
    for i, prompt in enumerate(prompts(4)):
        h.add(f"plain{i}", prompt, GenerationParams(max_new_tokens=30))
        h.add(f"spec{i}", prompt, GenerationParams(max_new_tokens=30, **knobs))
    h.run()  # all eight at once: speculative rows share the forward with plain ones
    for i in range(4):
        assert h.token_ids(f"spec{i}") == h.token_ids(f"plain{i}")
        assert h.finish_reason(f"spec{i}") == h.finish_reason(f"plain{i}")
    assert sum(counting.drafted.values()) > 0
    if knobs.get("assistant_model") == "self":  # the target drafting for itself: everything accepted
        assert counting.accepted["self"] == counting.drafted["self"]


def test_seeded_sampling_with_prompt_lookup_draws_what_plain_sampling_draws(model, smollm2_tokenizer):
    h, counting = harness(model, smollm2_tokenizer)
    sampling = dict(max_new_tokens=24, do_sample=True, temperature=0.7, top_k=20, repetition_penalty=1.1)
    for i, prompt in enumerate(prompts(3, seed=5)):
        h.add(f"plain{i}", prompt, GenerationParams(**sampling, seed=i))
        h.add(f"lookup{i}", prompt, GenerationParams(**sampling, seed=i, prompt_lookup_num_tokens=4))
    h.run()
    for i in range(3):  # drafts without a distribution are kept only when they equal the draw
        assert h.token_ids(f"lookup{i}") == h.token_ids(f"plain{i}")
    assert counting.drafted.get("prompt_lookup", 0) > 0


def test_a_prediction_drafts_first_and_leaves_the_output_unchanged(model, smollm2_tokenizer):
    """OpenAI's Predicted Outputs: prompt lookup searches ``prediction_ids`` before the row's own tokens.
    Given the reply itself as the prediction, most drafts are accepted; given nothing useful, the reply
    is still plain greedy's."""
    prompt = list(range(30, 42))  # no repeats: the prompt alone drafts nothing
    h, _ = harness(model, smollm2_tokenizer)
    h.add("plain", prompt, GenerationParams(max_new_tokens=40))
    h.run()
    expected = h.token_ids("plain")
    for prediction in (expected, [7, 8, 9]):
        h, counting = harness(model, smollm2_tokenizer)
        params = GenerationParams(max_new_tokens=40, prompt_lookup_num_tokens=10, prediction_ids=list(prediction))
        h.add("predicted", prompt, params)
        h.run()
        assert h.token_ids("predicted") == expected
        if prediction == expected:
            assert counting.accepted["prompt_lookup"] >= len(expected) // 2


def test_seeded_speculative_sampling_reproduces_alone_and_in_a_crowd(model, stranger, smollm2_tokenizer):
    sampling = dict(max_new_tokens=24, do_sample=True, temperature=0.7, top_k=20, seed=3)
    results = []
    for crowd in (False, True):
        h, counting = harness(model, smollm2_tokenizer, {"stranger": stranger, "self": model})
        for i, prompt in enumerate(prompts(2, seed=8)):
            h.add(f"draft{i}", prompt, GenerationParams(**sampling, assistant_model="stranger"))
            h.add(f"exit{i}", prompt, GenerationParams(**sampling, assistant_early_exit=2))
            if crowd:
                h.add(f"other{i}", prompt, GenerationParams(max_new_tokens=10, assistant_model="self"))
        h.run()
        results.append([h.token_ids(f"{kind}{i}") for kind in ("draft", "exit") for i in range(2)])
        assert counting.drafted.get("stranger", 0) > 0
    assert results[0] == results[1]


def test_speculative_sampling_keeps_the_target_distribution(smollm2_tokenizer):
    """First and second tokens of speculative sampling (drafts from a disagreeing assistant) follow
    the target's processed distribution: chi-square over 600 seeds, fixed, so never flaky."""
    vocab = 8
    target, assistant = tiny_llama(vocab, seed=1, num_layers=1), tiny_llama(vocab, seed=2, num_layers=1)
    h, counting = harness(target, smollm2_tokenizer, {"draft": assistant}, max_num_seqs=64)
    prompt = [3, 4, 5]
    knobs = dict(max_new_tokens=3, do_sample=True, ignore_eos=True, assistant_model="draft",
                 num_assistant_tokens=2, num_assistant_tokens_schedule="constant")  # fmt: skip
    seeds = range(600)
    for seed in seeds:
        h.add(f"r{seed}", prompt, GenerationParams(**knobs, seed=seed))
    h.run()
    assert counting.drafted["draft"] > 0
    with torch.inference_mode():
        first_probs = torch.softmax(target(torch.tensor([prompt])).logits[0, -1], -1)
    first = [h.token_ids(f"r{s}")[0] for s in seeds]
    observed = torch.bincount(torch.tensor(first), minlength=vocab).float()
    expected = first_probs * len(first)
    chi2 = float(((observed - expected) ** 2 / expected.clamp(min=1e-9)).sum())
    assert chi2 < 24.3  # chi-square 99.9% quantile, 7 degrees of freedom
    # second token, conditioned on the most frequent first token
    top = int(observed.argmax())
    second = [h.token_ids(f"r{s}")[1] for s in seeds if h.token_ids(f"r{s}")[0] == top]
    with torch.inference_mode():
        second_probs = torch.softmax(target(torch.tensor([[*prompt, top]])).logits[0, -1], -1)
    observed2 = torch.bincount(torch.tensor(second), minlength=vocab).float()
    expected2 = second_probs * len(second)
    chi2 = float(((observed2 - expected2) ** 2 / expected2.clamp(min=1e-9)).sum())
    assert chi2 < 24.3


def test_backoff_stops_drafting_for_an_assistant_that_keeps_failing(model, stranger, smollm2_tokenizer):
    h, counting = harness(model, smollm2_tokenizer, {"stranger": stranger})
    params = GenerationParams(
        max_new_tokens=120, ignore_eos=True, assistant_model="stranger", num_assistant_tokens=5,
        num_assistant_tokens_schedule="constant",
    )  # fmt: skip
    h.add("r", prompts(1, seed=9)[0], params)
    h.run()
    rate = counting.accepted["stranger"] / counting.drafted["stranger"]
    if rate < 0.3:  # rarely agrees: drafting must have paused for most steps
        assert counting.drafted["stranger"] < 5 * 120 / 3


def test_confidence_threshold_cuts_drafts_short(model, stranger, smollm2_tokenizer):
    h, counting = harness(model, smollm2_tokenizer, {"stranger": stranger})
    knobs = dict(max_new_tokens=30, assistant_model="stranger", num_assistant_tokens=6,
                 num_assistant_tokens_schedule="constant")  # fmt: skip
    prompt = prompts(1, seed=4)[0]
    h.add("plain", prompt, GenerationParams(max_new_tokens=30))
    h.add("doubtful", prompt, GenerationParams(**knobs, assistant_confidence_threshold=0.99))
    h.run()
    assert h.token_ids("doubtful") == h.token_ids("plain")
    # a random tiny assistant is never 99% sure: every draft stops after its first token
    assert counting.drafted["stranger"] <= 30


def test_draft_length_schedule_and_backoff():
    length = DraftLength(4, "heuristic")
    assert length.next(10) == 4
    length.update(4, 4)
    assert length.current == 6  # all accepted: +2, as HF
    length.update(6, 1)
    assert length.current == 5  # otherwise -1
    poor = DraftLength(5, "constant")
    poor.update(5, 0)
    poor.update(5, 0)  # two poor rounds: pause
    assert [poor.next(10) for _ in range(4)] == [0, 0, 0, 0]
    assert poor.next(10) == 5  # probe
    poor.update(5, 0)  # the probe fails: a longer pause
    assert [poor.next(10) for _ in range(8)] == [0] * 8
    assert poor.next(3) == 3  # never more than the limit


@pytest.mark.parametrize("seed", range(20))
def test_prompt_lookup_proposes_what_hf_proposes(seed):
    rng = random.Random(seed)
    history = [rng.randrange(3, 12) for _ in range(rng.randrange(2, 60))]
    num_tokens, ngram = rng.randrange(1, 8), rng.randrange(1, 4)
    hf = PromptLookupCandidateGenerator(
        eos_token_id=torch.tensor([EOS]), num_output_tokens=num_tokens, max_matching_ngram_size=ngram,
        max_length=10_000,
    )  # fmt: skip
    candidates, _ = hf.get_candidates(torch.tensor([history]))
    theirs = candidates[0, len(history) :].tolist()
    assert propose_prompt_lookup(history, num_tokens, ngram, {EOS}) == theirs


def test_generation_config_names_are_hfs():
    # the request fields are transformers' own knobs
    config = GenerationConfig(prompt_lookup_num_tokens=3, assistant_early_exit=2, num_assistant_tokens=4)
    assert config.prompt_lookup_num_tokens == 3 and config.assistant_early_exit == 2


# ---- universal assisted decoding: an assistant with another tokenizer ------------------------------
def byte_level_tokenizer(vocab_size: int = 300):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<eos>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    backend.train_from_iterator(["the quick brown fox jumps over the lazy dog " * 20, "hello world " * 20], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>")


def test_universal_assistant_with_another_tokenizer_keeps_greedy_output(smollm2_tokenizer):
    target = tiny_llama(len(smollm2_tokenizer), seed=1)
    other = byte_level_tokenizer()
    assistant = tiny_llama(len(other), seed=2)
    h, counting = harness(target, smollm2_tokenizer, {"other": (assistant, other, {other.eos_token_id})})
    for i, text in enumerate(["The quick brown fox", "hello world, hello", "Once upon a time there"]):
        prompt = smollm2_tokenizer.encode(text)
        h.add(f"plain{i}", prompt, GenerationParams(max_new_tokens=20))
        h.add(f"spec{i}", prompt, GenerationParams(max_new_tokens=20, assistant_model="other"))
    h.run()
    for i in range(3):
        assert h.token_ids(f"spec{i}") == h.token_ids(f"plain{i}")
    assert counting.drafted["other"] > 0


def test_drafted_text_becomes_target_tokens_after_the_tail(smollm2_tokenizer):
    from decoding.strategies.universal import new_tokens_after_tail, target_drafts

    history = smollm2_tokenizer.encode("The capital of France is")
    drafts = target_drafts(history, " Paris, and the capital", smollm2_tokenizer, 10)
    assert smollm2_tokenizer.decode(drafts) == " Paris, and the capital"
    assert new_tokens_after_tail([5, 6, 7], [6, 7, 8, 9]) == [8, 9]
    assert new_tokens_after_tail([5, 6, 7], [1, 2]) == []


@pytest.mark.slow
def test_real_pair_with_different_tokenizers_keeps_greedy_output(smollm2):
    """SmolLM2 target with Gemma 3 270M drafting through text, and the reverse, on real prompts."""
    import copy

    from decoding.model.attention import register_attention
    from decoding.model.loading import load_model

    gemma = load_model("gemma3-270m", attn_implementation=register_attention())
    pairs = [(smollm2, gemma, "Here is a list of fruits: apple, banana, cherry. Repeat the list: apple,"),
             (gemma, smollm2, "The capital of France is Paris. The capital of France is")]  # fmt: skip
    for target, helper, text in pairs:
        assistant = (helper.model, copy.deepcopy(helper.tokenizer), set(helper.eos_token_ids))
        h, counting = harness(target.model, target.tokenizer, {"helper": assistant}, max_model_len=256)
        h.engine.drafter.target_tokenizer = target.tokenizer
        prompt = target.tokenizer.encode(text)
        h.add("plain", prompt, GenerationParams(max_new_tokens=16))
        h.add("spec", prompt, GenerationParams(max_new_tokens=16, assistant_model="helper"))
        h.run()
        assert h.token_ids("spec") == h.token_ids("plain")
        if target is gemma:  # SmolLM2 is the smaller one: it drafts
            assert counting.drafted["helper"] > 0
        else:  # Gemma 3 270M is larger than SmolLM2: its drafts could never pay, so it does not draft
            assert counting.drafted.get("helper", 0) == 0
