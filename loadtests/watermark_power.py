"""Detection power of the watermark on the embedded model: how often it is found, and falsely found.

Generates ``--num`` sampled completions of ``--new-tokens`` forced tokens (min_new_tokens =
max_new_tokens, temperature 1) with the watermark and ``--num`` without it, all in one continuous
batch through Decoda's engine on SmolLM2-135M-Instruct, then scores each completion's token ids
(the prompt left out, as HF advises) with the detector at ``--z``. It prints the share of
watermarked completions flagged (true positive rate) and of plain ones flagged (false positive
rate), with the median z-scores.

    .venv/bin/python -m loadtests.watermark_power [--num 50] [--new-tokens 200] [--z 4] \
        [--seeding-scheme lefthash] [--bias 2.0] [--greenlist-ratio 0.25]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

from decoding.engine.core import Engine
from decoding.engine.limits import EngineLimits
from decoding.model.attention import register_attention
from decoding.model.loading import load_model
from decoding.model.packed_linear import pack_linears
from decoding.outputs import RequestOutput
from decoding.params import GenerationParams
from decoding.params.watermarking import WatermarkingConfig
from decoding.sampling.watermark import detect_watermark

TOPICS = [
    "the ocean", "a city at night", "learning to cook", "the history of bicycles", "a dragon who bakes bread",
    "winter in the mountains", "how bees communicate", "a lost key", "the first day at a new job", "volcanoes",
    "a friendship between a cat and a crow", "the moon landing", "gardening on a balcony", "a rainy Sunday",
    "how computers store numbers", "an old lighthouse", "a train journey across a desert", "chess strategy",
    "the water cycle", "a robot learning to paint",
]
STYLES = ["Write a short story about", "Explain to a child", "Write a blog post about", "Describe"]


def prompts(tokenizer: object, count: int) -> list[list[int]]:
    texts = [f"{STYLES[i % len(STYLES)]} {TOPICS[i % len(TOPICS)]}." for i in range(count)]
    return [
        tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True, tokenize=True,
                                      return_dict=True)["input_ids"]  # fmt: skip
        for t in texts
    ]


Jobs = dict[str, tuple[list[int], GenerationParams]]


def generate(engine: Engine, outputs: dict[str, list[int]], jobs: Jobs) -> None:
    for request_id, (prompt_ids, params) in jobs.items():
        engine.add_request(request_id, prompt_ids, params)
    with torch.inference_mode():
        while engine.has_work():
            engine.step()
    missing = [rid for rid in jobs if len(outputs.get(rid, [])) != jobs[rid][1].max_new_tokens]
    if missing:
        raise RuntimeError(f"requests {missing[:3]} did not generate their tokens")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--num", type=int, default=50, help="generations with the watermark, and as many without")
    parser.add_argument("--new-tokens", type=int, default=200)
    parser.add_argument("--z", type=float, default=4.0, help="detection threshold on the z-score")
    parser.add_argument("--seeding-scheme", default="lefthash", choices=("lefthash", "selfhash"))
    parser.add_argument("--bias", type=float, default=2.0)
    parser.add_argument("--greenlist-ratio", type=float, default=0.25)
    parser.add_argument("--batch", type=int, default=32, help="rows in the continuous batch")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = WatermarkingConfig(args.greenlist_ratio, args.bias, seeding_scheme=args.seeding_scheme)
    config.validate()
    loaded = load_model(args.model, dtype="float32", attn_implementation=register_attention())
    pack_linears(loaded.model)
    tokenizer = copy.deepcopy(loaded.tokenizer)
    outputs: dict[str, list[int]] = {}

    def collect(output: RequestOutput) -> None:
        if output.error:
            raise RuntimeError(f"{output.request_id} failed: {output.error}")
        outputs.setdefault(output.request_id, []).extend(t for d in output.deltas for t in d.token_ids)

    limits = EngineLimits(max_model_len=512, max_num_seqs=args.batch, max_num_batched_tokens=1024)
    engine = Engine(loaded.model, tokenizer, loaded.eos_token_ids, limits, collect, torch.device("cpu"))
    n = args.new_tokens
    jobs = {}
    for i, prompt_ids in enumerate(prompts(tokenizer, args.num)):
        knobs = dict(max_new_tokens=n, min_new_tokens=n, do_sample=True, temperature=1.0, seed=1000 + i)
        jobs[f"marked-{i}"] = (prompt_ids, GenerationParams(**knobs, watermarking_config=config))
        jobs[f"plain-{i}"] = (prompt_ids, GenerationParams(**knobs))
    start = time.perf_counter()
    generate(engine, outputs, jobs)
    elapsed = time.perf_counter() - start
    vocab_size = loaded.model.config.vocab_size
    bos = loaded.model.config.bos_token_id
    z = {
        kind: [
            detect_watermark(outputs[f"{kind}-{i}"], config, vocab_size, bos_token_id=bos, z_threshold=args.z).z_score
            for i in range(args.num)
        ]
        for kind in ("marked", "plain")
    }
    print(f"model {args.model}; {args.num} sampled generations (temperature 1, {n} tokens) with and {args.num} "
          f"without the watermark {config.to_dict()}; generated in {elapsed:.0f} s")  # fmt: skip
    for kind, label in (("marked", "watermarked"), ("plain", "unwatermarked")):
        flagged = sum(score > args.z for score in z[kind])
        print(f"{label:14} flagged at z > {args.z:g}: {flagged}/{args.num} = {flagged / args.num:.0%}   "
              f"z median {statistics.median(z[kind]):.2f} (min {min(z[kind]):.2f}, max {max(z[kind]):.2f})")


if __name__ == "__main__":
    main()
