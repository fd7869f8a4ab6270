"""Golden outputs of transformers 4.x's diverse (group) beam search and contrastive search on encoder-decoder
models: the tiny Bart, Marian and T5 of tests/test_engine_seq2seq.py.

transformers 5 moved both strategies out of its core (tests/make_hf4_golden.py records them for decoder-only
models); this records what 4.x's own ``generate()`` returns for the encoder-decoder families, so the engine's
rows (their cross-attention state forked and reordered with the beams) are checked against the reference
without network access:

    .venv/bin/python tests/make_hf4_seq2seq_golden.py     # writes tests/golden/hf4/seq2seq.json

As the decoder-only script, it runs in two halves: the outer one (transformers 5) builds each seeded tiny model
as the test does, saves it to a temporary folder, records a digest of its weights (the test rebuilds the model
and checks the digest) and the cases' encoder inputs; the inner one (the 4.x venv ``make_hf4_golden`` builds)
loads the folders, checks their logits against 5.x's and runs ``generate()``.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.make_hf4_golden import GOLDEN, HF4_TRANSFORMERS, hf4_python  # noqa: E402

OUT = GOLDEN / "seq2seq.json"
FAMILY_NAMES = ("bart", "marian", "t5")
CASES_PER_FAMILY = 2
SPECS = [
    ("group_beam_search", dict(num_beams=4, num_beam_groups=2, diversity_penalty=1.0, max_new_tokens=10,
                               num_return_sequences=2)),
    ("group_beam_search", dict(num_beams=6, num_beam_groups=3, diversity_penalty=0.5, max_new_tokens=10,
                               length_penalty=2.0, early_stopping=True, num_return_sequences=3)),
    ("group_beam_search", dict(num_beams=4, num_beam_groups=4, diversity_penalty=2.0, max_new_tokens=8,
                               no_repeat_ngram_size=2, num_return_sequences=4)),
    ("contrastive_search", dict(penalty_alpha=0.6, top_k=4, max_new_tokens=10)),
]  # fmt: skip


def weights_digest(model) -> str:  # noqa: ANN001
    """sha256 over the state dict's names and float32 bytes, in order."""
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().float().contiguous().numpy().tobytes())
    return digest.hexdigest()


def encoder_inputs(name: str, vocab: int, eos: int) -> list[list[int]]:
    rng = random.Random(f"hf4-{name}")
    return [[rng.randrange(3, vocab - 1) for _ in range(rng.randrange(4, 30))] + [eos] for _ in range(CASES_PER_FAMILY)]


def outer(args: argparse.Namespace) -> None:
    import torch
    import transformers

    from tests.test_engine_seq2seq import EOS, FAMILIES, VOCAB

    python = hf4_python(Path(args.venv))
    with tempfile.TemporaryDirectory() as tmp:
        models, cases, checks = {}, [], {}
        for name in FAMILY_NAMES:
            model = FAMILIES[name]()
            folder = Path(tmp) / name
            model.save_pretrained(folder)
            start = model.config.decoder_start_token_id
            models[name] = {"folder": str(folder), "class": type(model).__name__, "digest": weights_digest(model),
                            "decoder_start_token_id": start}  # fmt: skip
            inputs = encoder_inputs(name, VOCAB, EOS)
            with torch.inference_mode():
                checks[name] = model(input_ids=torch.tensor([inputs[0]]),
                                     decoder_input_ids=torch.tensor([[start]])).logits[0, -1].tolist()  # fmt: skip
            for strategy, kwargs in SPECS:
                for i, tokens in enumerate(inputs):
                    cases.append({"name": f"{name}/{strategy}/{json.dumps(kwargs, sort_keys=True)}/input{i}",
                                  "model": name, "strategy": strategy, "encoder_ids": tokens,
                                  "decoder_prompt": [start], "generate_kwargs": kwargs})  # fmt: skip
        job, result = Path(tmp) / "job.json", Path(tmp) / "result.json"
        job.write_text(json.dumps({"models": models, "cases": cases, "eos": EOS, "pad": 0}))
        subprocess.run([str(python), __file__, "--inner", str(job), str(result)], check=True)
        inner_out = json.loads(result.read_text())
    for name, logits in inner_out["logits"].items():
        diff = max(abs(a - b) for a, b in zip(logits, checks[name], strict=True))
        print(f"logits check {name}: transformers {HF4_TRANSFORMERS} vs {transformers.__version__}: {diff:.2e}")
        if diff > 1e-4:
            raise SystemExit(f"{name}: transformers 4.x does not load the model as 5.x does (max diff {diff})")
    golden = {
        "transformers_version": inner_out["transformers_version"],
        "torch_version": inner_out["torch_version"],
        "generated_with": f"tests/make_hf4_seq2seq_golden.py (outer: transformers {transformers.__version__}, "
        f"torch {torch.__version__})",
        "generated_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "models": {name: {k: v for k, v in m.items() if k != "folder"} for name, m in models.items()},
        "eos_token_id": EOS,
        "pad_token_id": 0,
        "cases": inner_out["cases"],
    }
    OUT.write_text(json.dumps(golden, indent=1) + "\n")
    print(f"wrote {len(golden['cases'])} cases to {OUT}")


def inner(job_path: str, result_path: str) -> None:
    import torch
    import transformers

    job = json.loads(Path(job_path).read_text())
    models = {name: getattr(transformers, m["class"]).from_pretrained(m["folder"], torch_dtype=torch.float32).eval()
              for name, m in job["models"].items()}  # fmt: skip
    logits, out_cases = {}, []
    for case in job["cases"]:
        model = models[case["model"]]
        encoder = torch.tensor([case["encoder_ids"]])
        prompt = torch.tensor([case["decoder_prompt"]])
        with torch.inference_mode():
            if case["model"] not in logits:
                logits[case["model"]] = model(input_ids=encoder, decoder_input_ids=prompt).logits[0, -1].tolist()
            out = model.generate(
                input_ids=encoder, attention_mask=torch.ones_like(encoder), decoder_input_ids=prompt,
                do_sample=False, eos_token_id=job["eos"], pad_token_id=job["pad"], forced_bos_token_id=None,
                forced_eos_token_id=None, suppress_tokens=None, begin_suppress_tokens=None, output_scores=True,
                return_dict_in_generate=True, **case["generate_kwargs"],
            )  # fmt: skip
        scores = getattr(out, "sequences_scores", None)
        out_cases.append({**case, "sequences": out.sequences[:, prompt.shape[1] :].tolist(),
                          "sequence_scores": None if scores is None else scores.tolist()})  # fmt: skip
        print(case["name"], out.sequences.shape[1] - prompt.shape[1], "new tokens", flush=True)
    Path(result_path).write_text(json.dumps({"transformers_version": transformers.__version__,
                                             "torch_version": torch.__version__, "logits": logits,
                                             "cases": out_cases}))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--venv", default="/tmp/decoda-hf4-venv", help="where the transformers 4.x venv lives")
    parser.add_argument("--inner", nargs=2, metavar=("JOB", "RESULT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inner:
        inner(*args.inner)
    else:
        outer(args)


if __name__ == "__main__":
    main()
