"""Golden outputs of transformers 4.x for the strategies transformers 5 removed from its core.

Diverse (group) beam search, contrastive search and DoLa live in transformers 4.x's
``generation/utils.py``; 5.x moved them to hub repositories. This script records what 4.x's
own implementations return, so the tests can compare Decoda's engine without network access:

    .venv/bin/python tests/make_hf4_golden.py            # writes tests/golden/hf4/

It runs in two halves. The outer half (the project's .venv, transformers 5) saves the tiny
random model and turns the prompts into token ids (4.x cannot read 5.x tokenizer files), then
builds a separate venv with the pinned versions below (``--venv``, created once) and re-runs
itself there. The inner half loads both models with transformers 4.x, checks its logits against
5.x's (4.x misses the RoPE settings of a 5.x config: ``rope_theta`` is patched in), and runs
``generate()`` for every case.
"""

from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HF4_TRANSFORMERS = "4.51.3"  # the last 4.x minor we checked that has all three in core
HF4_TORCH = "2.13.0"
GOLDEN = Path(__file__).resolve().parent / "golden" / "hf4"
TINY = GOLDEN / "tiny-llama"
EOS_TINY, PAD_TINY = 2, 0

SMOLLM2_PROMPTS = [
    "What is the capital of France?",
    "Write a short poem about autumn leaves.",
    "Explain in one sentence why the sky is blue.",
]


def tiny_prompts() -> list[list[int]]:
    import random

    rng = random.Random(4)
    return [[rng.randrange(3, 256) for _ in range(rng.randrange(5, 40))] for _ in range(3)]


def case_specs() -> list[tuple[str, str, dict]]:
    """(model, strategy, generate kwargs): every case runs on every prompt of its model."""
    group = [
        dict(num_beams=4, num_beam_groups=2, diversity_penalty=1.0, max_new_tokens=20),
        dict(num_beams=4, num_beam_groups=2, diversity_penalty=1.0, max_new_tokens=20, early_stopping=True,
             num_return_sequences=4),
        dict(num_beams=6, num_beam_groups=3, diversity_penalty=0.5, max_new_tokens=16, early_stopping="never",
             length_penalty=2.0, num_return_sequences=2),
        dict(num_beams=4, num_beam_groups=2, diversity_penalty=1.0, max_new_tokens=24, length_penalty=0.6,
             no_repeat_ngram_size=3, num_return_sequences=2),
        dict(num_beams=4, num_beam_groups=4, diversity_penalty=2.0, max_new_tokens=12, min_new_tokens=6,
             num_return_sequences=3),
    ]  # fmt: skip
    contrastive = [
        dict(penalty_alpha=0.6, top_k=4, max_new_tokens=30),
        dict(penalty_alpha=0.4, top_k=6, max_new_tokens=30, repetition_penalty=1.1),
    ]
    dola_tiny = [
        dict(dola_layers="high", max_new_tokens=30, repetition_penalty=1.2),
        dict(dola_layers="low", max_new_tokens=30, repetition_penalty=1.2),
        dict(dola_layers=[0, 2], max_new_tokens=30),
    ]
    dola_real = [
        dict(dola_layers="high", max_new_tokens=30, repetition_penalty=1.2),
        dict(dola_layers="low", max_new_tokens=30, repetition_penalty=1.2),
        dict(dola_layers=[4, 8, 12], max_new_tokens=30, repetition_penalty=1.0),
    ]
    specs = []
    for model in ("tiny-llama", "smollm2-135m-instruct"):
        specs += [(model, "group_beam_search", k) for k in group]
        specs += [(model, "contrastive_search", k) for k in contrastive]
        specs += [(model, "dola", k) for k in (dola_tiny if model == "tiny-llama" else dola_real)]
    long_run = dict(max_new_tokens=120, min_new_tokens=120)  # 100+ tokens, no early eos
    specs.append(("smollm2-135m-instruct", "contrastive_search", dict(penalty_alpha=0.6, top_k=4, **long_run)))
    specs.append(("smollm2-135m-instruct", "dola", dict(dola_layers="high", repetition_penalty=1.2, **long_run)))
    return specs


# ---- outer half: transformers 5, the project's venv ------------------------------------------------
def hf4_python(venv: Path) -> Path:
    """The interpreter of the transformers 4.x venv, created (with the pinned versions) where it is missing."""
    if not (venv / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(venv / "bin" / "pip"), "install", "-q"]
        subprocess.run([*pip, f"torch=={HF4_TORCH}", f"transformers=={HF4_TRANSFORMERS}"], check=True)
    return venv / "bin" / "python"


def smollm2_dir() -> str:
    folders = sorted(glob.glob(os.path.expanduser("~/.cache/decoda/models/smollm2-135m-instruct-*/model.safetensors")))
    if not folders:  # convert it once through the project's loader
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
        from decoding.model.loading import load_model

        load_model("smollm2-135m-instruct")
        return smollm2_dir()
    return str(Path(folders[-1]).parent)


def write_tiny_model() -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, rope_theta=10000.0, tie_word_embeddings=False,
        bos_token_id=1, eos_token_id=EOS_TINY, pad_token_id=PAD_TINY,
    )  # fmt: skip
    LlamaForCausalLM(config).eval().save_pretrained(TINY)


def reference_logits(folder: str, prompt_ids: list[int]) -> list[float]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.inference_mode():
        return model(torch.tensor([prompt_ids])).logits[0, -1].tolist()


def outer(args: argparse.Namespace) -> None:
    import torch
    import transformers
    from transformers import AutoTokenizer

    GOLDEN.mkdir(parents=True, exist_ok=True)
    write_tiny_model()
    smol = args.smollm2_dir or smollm2_dir()
    tokenizer = AutoTokenizer.from_pretrained(smol)
    prompts = {
        "tiny-llama": tiny_prompts(),
        "smollm2-135m-instruct": [
            list(tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                               tokenize=True, return_dict=True)["input_ids"])
            for p in SMOLLM2_PROMPTS
        ],
    }  # fmt: skip
    config = json.loads((Path(smol) / "config.json").read_text())
    rope_theta = config.get("rope_theta") or config["rope_parameters"]["rope_theta"]
    models = {
        "tiny-llama": {"folder": str(TINY), "eos": EOS_TINY, "pad": PAD_TINY, "rope_theta": 10000.0},
        "smollm2-135m-instruct": {"folder": smol, "eos": config["eos_token_id"], "pad": config["pad_token_id"],
                                  "rope_theta": rope_theta},
    }  # fmt: skip
    cases = []
    for model, strategy, kwargs in case_specs():
        # the long runs use one prompt; everything else every prompt of its model
        chosen = prompts[model][:1] if kwargs.get("max_new_tokens", 0) >= 100 else prompts[model]
        for i, prompt_ids in enumerate(chosen):
            name = f"{model}/{strategy}/{json.dumps(kwargs, sort_keys=True)}/prompt{i}"
            cases.append({"name": name, "model": model, "strategy": strategy, "prompt_ids": prompt_ids,
                          "generate_kwargs": kwargs})  # fmt: skip
    checks = {name: reference_logits(m["folder"], prompts[name][0]) for name, m in models.items()}
    python = hf4_python(Path(args.venv))
    with tempfile.TemporaryDirectory() as tmp:
        job = Path(tmp) / "job.json"
        job.write_text(json.dumps({"models": models, "cases": cases, "prompts": prompts}))
        result = Path(tmp) / "result.json"
        subprocess.run([str(python), __file__, "--inner", str(job), str(result)], check=True)
        inner_out = json.loads(result.read_text())
    for name, logits in inner_out["logits"].items():
        diff = max(abs(a - b) for a, b in zip(logits, checks[name], strict=True))
        print(
            f"logits check {name}: transformers {HF4_TRANSFORMERS} vs {transformers.__version__}: max |diff| {diff:.2e}"
        )
        if diff > 1e-4:
            raise SystemExit(f"{name}: transformers 4.x does not load the model as 5.x does (max diff {diff})")
    golden = {
        "transformers_version": inner_out["transformers_version"],
        "torch_version": inner_out["torch_version"],
        "generated_with": f"tests/make_hf4_golden.py (outer: transformers {transformers.__version__}, "
        f"torch {torch.__version__})",
        "generated_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "models": {name: {k: v for k, v in m.items() if k != "folder"} for name, m in models.items()},
        "cases": inner_out["cases"],
    }
    (GOLDEN / "reference.json").write_text(json.dumps(golden, indent=1) + "\n")
    print(f"wrote {len(golden['cases'])} cases to {GOLDEN / 'reference.json'}")


# ---- inner half: transformers 4.x ---------------------------------------------------------------------
def load_hf4(folder: str, rope_theta: float):  # noqa: ANN201
    import shutil

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = json.loads((Path(folder) / "config.json").read_text())
    config["rope_theta"] = rope_theta  # 4.x reads rope_theta; 5.x writes rope_parameters
    config.pop("rope_parameters", None)
    tmp = Path(tempfile.mkdtemp())
    (tmp / "config.json").write_text(json.dumps(config))
    shutil.copy(Path(folder) / "model.safetensors", tmp / "model.safetensors")
    model = LlamaForCausalLM.from_pretrained(tmp, config=LlamaConfig.from_pretrained(tmp), torch_dtype=torch.float32)
    return model.eval()


def inner(job_path: str, result_path: str) -> None:
    import torch
    import transformers

    job = json.loads(Path(job_path).read_text())
    models = {name: load_hf4(m["folder"], m["rope_theta"]) for name, m in job["models"].items()}
    logits = {}
    with torch.inference_mode():
        for name, model in models.items():
            logits[name] = model(torch.tensor([job["prompts"][name][0]])).logits[0, -1].tolist()
    out_cases = []
    for case in job["cases"]:
        model = models[case["model"]]
        spec = job["models"][case["model"]]
        prompt = torch.tensor([case["prompt_ids"]])
        with torch.inference_mode():
            out = model.generate(
                prompt, attention_mask=torch.ones_like(prompt), do_sample=False, eos_token_id=spec["eos"],
                pad_token_id=spec["pad"], output_scores=True, return_dict_in_generate=True, **case["generate_kwargs"],
            )  # fmt: skip
        scores = getattr(out, "sequences_scores", None)
        out_cases.append({
            **case,
            "eos_token_id": spec["eos"],
            "pad_token_id": spec["pad"],
            "sequences": out.sequences[:, prompt.shape[1] :].tolist(),
            "sequence_scores": None if scores is None else scores.tolist(),
        })  # fmt: skip
        print(case["name"], out.sequences.shape[1] - prompt.shape[1], "new tokens", flush=True)
    Path(result_path).write_text(
        json.dumps({"transformers_version": transformers.__version__, "torch_version": torch.__version__,
                    "logits": logits, "cases": out_cases})
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--venv", default="/tmp/decoda-hf4-venv", help="where the transformers 4.x venv lives")
    parser.add_argument("--smollm2-dir", default=None, help="converted SmolLM2 folder (default: the decoda cache)")
    parser.add_argument("--inner", nargs=2, metavar=("JOB", "RESULT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inner:
        inner(*args.inner)
    else:
        outer(args)


if __name__ == "__main__":
    main()
