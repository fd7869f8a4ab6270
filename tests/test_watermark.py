"""The watermark equals transformers' own: ``WatermarkLogitsProcessor`` on fake logits, ``generate(
watermarking_config=...)`` for greedy, sampling and beam search at batch size 1 and inside a mixed
batch, and ``WatermarkDetector`` on the same ids (z-score to 1e-4)."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import LlamaConfig, WatermarkDetector
from transformers import WatermarkingConfig as HFWatermarkingConfig
from transformers.generation.logits_process import WatermarkLogitsProcessor

from decoding.params import GenerationParams, ParameterError, validate
from decoding.params.watermarking import WatermarkingConfig
from decoding.sampling import RowSamplingState, SamplingBatch
from decoding.sampling.watermark import detect_watermark
from tests.engine_harness import EngineHarness, tiny_llama

EOS = 2
VOCAB = 512  # small, so HF's per-step randperm keeps the test fast; one processor case uses SmolLM2's 49152

CONFIGS = {
    "lefthash": WatermarkingConfig(),
    "lefthash-wide": WatermarkingConfig(greenlist_ratio=0.5, bias=2.5, hashing_key=7, context_width=3),
    "selfhash": WatermarkingConfig(seeding_scheme="selfhash"),
    "selfhash-wide": WatermarkingConfig(seeding_scheme="selfhash", context_width=2, bias=0.1, hashing_key=99991),
}


def hf_config(config: WatermarkingConfig) -> HFWatermarkingConfig:
    return HFWatermarkingConfig(**config.to_dict())


def prompts(count: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, VOCAB) for _ in range(rng.randrange(1, 20))] for _ in range(count)]


# ---- the processor on fake logits --------------------------------------------------------------------
@pytest.mark.parametrize("vocab", [VOCAB, 49152])
def test_processor_equals_hf_per_row_in_one_batch(vocab):
    rng = random.Random(vocab)
    params = [GenerationParams(watermarking_config=c) for c in CONFIGS.values()] + [GenerationParams()]
    histories = [[rng.randrange(vocab) for _ in range(rng.randrange(3, 30))] for _ in params]
    histories[1] = histories[1][:2]  # shorter than its context_width: HF skips the step
    rows = [RowSamplingState(p, h, [EOS], vocab, None) for p, h in zip(params, histories, strict=True)]
    logits = torch.randn(len(rows), vocab, generator=torch.Generator().manual_seed(vocab))
    ours = SamplingBatch(rows, "cpu").process(logits)
    for i, (p, history) in enumerate(zip(params, histories, strict=True)):
        if p.watermarking_config is None:
            assert torch.equal(ours[i], logits[i]), "a row without a watermark is untouched"
            continue
        hf = WatermarkLogitsProcessor(vocab, "cpu", **p.watermarking_config.to_dict())
        expected = hf(torch.tensor([history]), logits[i : i + 1].clone())[0]
        assert torch.equal(ours[i], expected), f"row {i}"
    assert torch.equal(ours[1], logits[1])
    assert not torch.equal(ours[0], logits[0])


def test_processor_runs_after_the_warpers_as_hf_orders_it():
    """HF 5 appends the watermark after temperature/top-k (transformers#34630), so a green id the
    top-k cut stays at -inf and the bias is not divided by the temperature."""
    config = WatermarkingConfig(bias=3.0)
    history = [5, 9, 11]
    params = GenerationParams(do_sample=True, temperature=0.5, top_k=7, watermarking_config=config)
    logits = torch.randn(1, VOCAB, generator=torch.Generator().manual_seed(1))
    ours = SamplingBatch([RowSamplingState(params, history, [EOS], VOCAB, None)], "cpu").process(logits)
    hf = WatermarkLogitsProcessor(VOCAB, "cpu", **config.to_dict())
    warped = logits / 0.5
    warped = warped.masked_fill(warped < torch.topk(warped, 7).values[..., -1:], float("-inf"))
    assert torch.equal(ours, hf(torch.tensor([history]), warped))


# ---- generation: batch size 1 against generate(), and in a mixed batch ---------------------------------
@pytest.fixture(scope="module")
def model():
    return tiny_llama(VOCAB, seed=4)


def hf_generate(model, prompt: list[int], config: WatermarkingConfig, seed: int | None = None, **kwargs) -> list:
    if seed is not None:
        torch.manual_seed(seed)
    kwargs.setdefault("top_k", 0)  # GenerationConfig would default to 50; our requests have none unless asked
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            watermarking_config=hf_config(config),
            eos_token_id=EOS,
            pad_token_id=0,
            **kwargs,
        )
    row = out[0, len(prompt) :].tolist()
    return row[: row.index(EOS) + 1] if EOS in row else row


def ours(model, tokenizer, prompt: list[int], params: GenerationParams) -> list[int]:
    harness = EngineHarness(model, tokenizer, [EOS])
    harness.add("r", prompt, params)
    harness.run()
    return harness.token_ids("r")


CASES = [
    ("greedy", {}, {}),
    ("sample", dict(do_sample=True, temperature=0.8, top_k=40), dict(do_sample=True, temperature=0.8, top_k=40)),
    ("beam", dict(num_beams=3), dict(num_beams=3)),
]


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_generation_equals_hf_generate(model, smollm2_tokenizer, case, name):
    label, knobs, hf_knobs = case
    config = CONFIGS[name]
    for p, prompt in enumerate(prompts(2, seed=len(name))):
        params = GenerationParams(max_new_tokens=12, watermarking_config=config, seed=40 + p, **knobs)
        expected = hf_generate(model, prompt, config, seed=40 + p, max_new_tokens=12, **hf_knobs)
        assert ours(model, smollm2_tokenizer, prompt, params) == expected, f"{label} {name} prompt {p}"


def test_the_watermark_steers_sampling_to_green_tokens(model, smollm2_tokenizer):
    config = WatermarkingConfig(bias=8.0)
    prompt = prompts(1, seed=3)[0]
    knobs = dict(max_new_tokens=40, ignore_eos=True, do_sample=True, seed=5)
    plain = ours(model, smollm2_tokenizer, prompt, GenerationParams(**knobs))
    marked = ours(model, smollm2_tokenizer, prompt, GenerationParams(**knobs, watermarking_config=config))
    assert detect_watermark(marked, config, VOCAB).green_fraction > 0.9
    assert detect_watermark(plain, config, VOCAB).green_fraction < 0.5


def test_watermarked_rows_in_a_mixed_batch_keep_their_tokens(model, smollm2_tokenizer):
    """Watermarked greedy/sampled/beam requests with different configs, next to plain ones, give
    exactly what each gives alone (= HF at batch size 1, above)."""
    work = prompts(6, seed=17)
    requests = {
        "wm-greedy": (work[0], GenerationParams(max_new_tokens=10, watermarking_config=CONFIGS["lefthash"])),
        "wm-self": (work[1], GenerationParams(max_new_tokens=10, watermarking_config=CONFIGS["selfhash-wide"])),
        "wm-sample": (work[2], GenerationParams(max_new_tokens=10, do_sample=True, seed=3,
                                                watermarking_config=CONFIGS["lefthash-wide"])),  # fmt: skip
        "wm-beam": (work[3], GenerationParams(max_new_tokens=8, num_beams=2, watermarking_config=CONFIGS["selfhash"])),
        "plain": (work[4], GenerationParams(max_new_tokens=10)),
        "plain-sample": (work[5], GenerationParams(max_new_tokens=10, do_sample=True, seed=9)),
    }
    alone = {rid: ours(model, smollm2_tokenizer, prompt, params) for rid, (prompt, params) in requests.items()}
    crowd = EngineHarness(model, smollm2_tokenizer, [EOS], max_num_seqs=16, max_num_batched_tokens=16)
    for rid, (prompt, params) in requests.items():
        crowd.add(rid, prompt, params)
    crowd.run()
    for rid in requests:
        assert crowd.token_ids(rid) == alone[rid], rid


# ---- the detector --------------------------------------------------------------------------------------
def hf_detect(config: WatermarkingConfig, ids: list[int], vocab: int, bos: int | None, **kwargs):
    detector = WatermarkDetector(
        LlamaConfig(vocab_size=vocab, bos_token_id=bos), "cpu", hf_config(config),
        ignore_repeated_ngrams=kwargs.pop("ignore_repeated_ngrams", False),
    )  # fmt: skip
    return detector(torch.tensor([ids]), return_dict=True, **kwargs)


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("ignore_repeated_ngrams", [False, True])
def test_detector_equals_hf_watermark_detector(model, smollm2_tokenizer, name, ignore_repeated_ngrams):
    config = CONFIGS[name]
    prompt = prompts(1, seed=8)[0]
    marked = ours(model, smollm2_tokenizer, prompt, GenerationParams(max_new_tokens=40, ignore_eos=True,
                                                                      watermarking_config=config))  # fmt: skip
    rng = random.Random(1)
    unmarked = [rng.randrange(VOCAB) for _ in range(30)]
    repeated = [1, *[7, 8, 7, 8, 7, 8, 9] * 3]  # a leading BOS (1) is dropped, as HF drops it
    for ids in (marked, unmarked, repeated):
        got = detect_watermark(ids, config, VOCAB, bos_token_id=1, z_threshold=2.5,
                               ignore_repeated_ngrams=ignore_repeated_ngrams)  # fmt: skip
        hf = hf_detect(config, ids, VOCAB, 1, z_threshold=2.5, ignore_repeated_ngrams=ignore_repeated_ngrams)
        assert got.num_tokens_scored == hf.num_tokens_scored[0]
        assert got.num_green_tokens == hf.num_green_tokens[0]
        assert got.green_fraction == pytest.approx(hf.green_fraction[0], abs=1e-12)
        assert got.z_score == pytest.approx(hf.z_score[0], abs=1e-4)
        assert got.p_value == pytest.approx(hf.p_value[0], abs=1e-6)
        assert got.prediction == bool(hf.prediction[0])


def test_detector_flags_watermarked_greedy_text(model, smollm2_tokenizer):
    config = WatermarkingConfig(bias=6.0)
    marked = ours(model, smollm2_tokenizer, [5, 6, 7], GenerationParams(max_new_tokens=60, ignore_eos=True,
                                                                         watermarking_config=config))  # fmt: skip
    assert detect_watermark(marked, config, VOCAB, z_threshold=4).prediction
    other_key = WatermarkingConfig(bias=6.0, hashing_key=12345)
    assert not detect_watermark(marked, other_key, VOCAB, z_threshold=4).prediction


def test_too_short_text_says_how_many_tokens_are_needed():
    config = WatermarkingConfig(context_width=3)
    with pytest.raises(ParameterError) as err:
        detect_watermark([1, 5, 6, 7], config, VOCAB, bos_token_id=1, param="text")
    assert err.value.param == "text"
    assert "at least 4 tokens" in err.value.message and "got 3 after the leading BOS" in err.value.message
    assert detect_watermark([5, 6, 7, 8], config, VOCAB).num_tokens_scored == 1


# ---- validation ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("data", "field", "words"),
    [
        ({"greenlist_ratio": 1.0}, "greenlist_ratio", "in (0, 1), got 1.0"),
        ({"greenlist_ratio": 0}, "greenlist_ratio", "in (0, 1), got 0"),
        ({"seeding_scheme": "righthash"}, "seeding_scheme", "got 'righthash'"),
        ({"context_width": 0}, "context_width", "in [1, 1024], got 0"),
        ({"context_width": 1.5}, "context_width", "must be an integer"),
        ({"bias": -1}, "bias", "in [0, 100], got -1"),
        ({"hashing_key": -3}, "hashing_key", "got -3"),
        ({"hashing_key": 2**64}, "hashing_key", "in [0, 9223372036854775807]"),  # whole bounds exactly
        ({"gamma": 0.5}, "gamma", "unknown field 'gamma'"),
    ],
)
def test_bad_configs_name_the_field(data, field, words):
    with pytest.raises(ParameterError) as err:
        WatermarkingConfig.from_dict(data)
    assert err.value.param == f"watermarking_config.{field}"
    assert words in err.value.message


def test_validate_checks_the_config_on_params():
    with pytest.raises(ParameterError) as err:
        validate(GenerationParams(watermarking_config=WatermarkingConfig(greenlist_ratio=2.0)))
    assert err.value.param == "watermarking_config.greenlist_ratio"
    validate(GenerationParams(watermarking_config=WatermarkingConfig(seeding_scheme="selfhash")))


def test_a_bad_server_file_names_the_file_and_the_field(tmp_path):
    path = tmp_path / "wm.json"
    path.write_text('{"seeding_scheme": "selfhash", "context_width": 0}')
    with pytest.raises(ValueError, match=r"wm\.json: watermarking_config\.context_width must be in \[1, 1024\]"):
        WatermarkingConfig.from_file(path)
    path.write_text("{not json")
    with pytest.raises(ValueError, match=r"wm\.json: not JSON"):
        WatermarkingConfig.from_file(path)
    with pytest.raises(ValueError, match="missing.json"):
        WatermarkingConfig.from_file(tmp_path / "missing.json")
    path.write_text('{"bias": 1.5, "hashing_key": 42}')
    assert WatermarkingConfig.from_file(path) == WatermarkingConfig(bias=1.5, hashing_key=42)
