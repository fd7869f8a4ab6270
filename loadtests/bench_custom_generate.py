"""custom_generate cost: Decoda's exclusive job against HF ``model.generate(custom_generate=PATH)``.

Same model (the embedded SmolLM2-135M-Instruct), prompt, method and arguments; float32, one thread;
tokens/s = generated tokens / wall time, best of ``--runs``. Decoda's figure includes what the job
adds around the method: switching the model to sdpa attention and back, the streamer (incremental
detokenization and one RequestOutput per token) and the stopping criteria checked per token.

    .venv/bin/python loadtests/bench_custom_generate.py --new-tokens 32 --runs 3
"""

from __future__ import annotations

import argparse
import copy
import time
from pathlib import Path

import torch
from transformers import GenerationConfig

from decoding.custom.loading import load_custom_methods
from decoding.engine.core import Engine
from decoding.engine.limits import EngineLimits
from decoding.model.attention import register_attention
from decoding.model.loading import load_model
from decoding.model.packed_linear import pack_linears
from decoding.params import GenerationParams

ROOT = Path(__file__).resolve().parent.parent
METHODS = {
    "left_padding": (ROOT / "config/custom_generate/left_padding", {"left_padding": 4, "pad_token": 2}),
    "lookahead": (ROOT / "config/custom_generate/lookahead", {"lookahead_top_k": 4}),
}
PROMPT = "Write a long story about a dragon who learns to bake bread in a small mountain village."


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    loaded = load_model("smollm2-135m-instruct", attn_implementation="sdpa")
    prompt = loaded.tokenizer.encode(PROMPT)
    served = copy.deepcopy(loaded.model)
    served.set_attn_implementation(register_attention())
    pack_linears(served)
    outputs: list = []
    engine = Engine(served, loaded.tokenizer, loaded.eos_token_ids, EngineLimits(512, 4, 512), outputs.append,
                    torch.device("cpu"))  # fmt: skip
    specs = [(name, str(path)) for name, (path, _) in METHODS.items()]
    engine.custom.methods.update(load_custom_methods(specs, True, served))
    # forced length: no eos, so both sides generate exactly --new-tokens
    config = GenerationConfig(max_new_tokens=args.new_tokens, eos_token_id=[])
    print(f"{'method':<14}{'Decoda tok/s':>14}{'HF tok/s':>10}")
    for name, (path, method_args) in METHODS.items():
        hf, ours = [], []
        for run in range(args.runs):
            started = time.perf_counter()
            with torch.inference_mode():
                out = loaded.model.generate(
                    input_ids=torch.tensor([prompt]), custom_generate=str(path), trust_remote_code=True,
                    generation_config=config, **method_args,
                )  # fmt: skip
            hf.append(
                (out.shape[1] - len(prompt) - method_args.get("left_padding", 0)) / (time.perf_counter() - started)
            )
            engine.custom.eos_token_ids = []  # forced length on Decoda's side too
            outputs.clear()
            params = GenerationParams(max_new_tokens=args.new_tokens, custom_generate=name,
                                      custom_generate_args=method_args)  # fmt: skip
            started = time.perf_counter()
            engine.add_request(f"{name}-{run}", prompt, params)
            with torch.inference_mode():
                while engine.has_work():
                    engine.step()
            generated = sum(len(d.token_ids) for o in outputs for d in o.deltas)
            ours.append(generated / (time.perf_counter() - started))
        print(f"{name:<14}{max(ours):>14.1f}{max(hf):>10.1f}")


if __name__ == "__main__":
    main()
