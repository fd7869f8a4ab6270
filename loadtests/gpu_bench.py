"""Decoda on a GPU against transformers on the same GPU: servers taking turns, one table.

For each model (SmolLM2-135M and Gemma 3 270M shapes, bfloat16): HF ``generate()`` for one
client, then Decoda (``--device cuda --compile``: decode steps from CUDA graphs) and
``transformers serve --continuous-batching`` (and plain ``transformers serve`` for one client),
each with 1, 16 and 64 concurrent streaming clients of the ``openai`` SDK (``loadtests.loadgen``),
128 new tokens a request.

A GPU machine here has no network and the real checkpoints are larger than what may travel to
it, so each model is its real config with seeded random weights (the same shapes, hence the same
work a token) and its real tokenizer; nobody reads the text, and every request runs to its
``max_tokens`` (Decoda's ``ignore_eos``; a random model's end-of-text token is one in 49k-262k).

    python -m loadtests.gpu_bench --out results/ --models smollm2,gemma3 --clients 1,16,64
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import httpx
import torch

from loadtests.compare import free_port  # stdlib and httpx only at import: safe on the GPU machine
from loadtests.loadgen import PROMPTS, build_parser, run_load

ROOT = Path(__file__).resolve().parent.parent
ASSETS = ROOT / ".gpu"
MODELS = {  # name -> (config folder, tokenizer folder or .tar.xz)
    "smollm2": ("smollm2-config", "smollm2-tokenizer"),
    "gemma3": ("gemma3-config", "gemma3-tokenizer.tar.xz"),
}


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def random_model(name: str, into: Path, device: str, dtype: torch.dtype) -> Path:
    """The model's real config and tokenizer with seeded random weights, saved as a folder."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    folder = into / name
    if (folder / "config.json").exists():
        return folder
    config_dir, tokenizer_src = MODELS[name]
    tokenizer_dir = ASSETS / tokenizer_src
    if tokenizer_src.endswith(".tar.xz"):
        with tarfile.open(tokenizer_dir) as archive:
            archive.extractall(into / "tokenizers", filter="data")
        tokenizer_dir = into / "tokenizers" / tokenizer_src.removesuffix(".tar.xz")
    config = AutoConfig.from_pretrained(ASSETS / config_dir)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(folder)
    del model
    return folder


def hf_generate_tok_s(folder: Path, device: str, dtype: torch.dtype, new_tokens: int) -> float:
    """One client through HF ``generate()`` (sdpa, its default cache): the best of two timed runs."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    ids = tokenizer(PROMPTS[0], return_tensors="pt").input_ids.to(device)
    best = 0.0
    with torch.inference_mode():
        model.generate(ids, max_new_tokens=8, min_new_tokens=8, do_sample=False)  # warm up
        for _ in range(2):
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            start = time.perf_counter()
            out = model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            best = max(best, (out.shape[1] - ids.shape[1]) / (time.perf_counter() - start))
    del model
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return best


def start(command: list[str], port: int, log_file: Path, ready: str, timeout: float) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log_file.open("w"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{command[:4]} exited early; see {log_file}:\n{log_file.read_text()[-3000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}{ready}", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"{command[:4]} not ready in {timeout} s; see {log_file}")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def load(port: int, model: str, clients: int, new_tokens: int, decoda: bool) -> dict:
    args = build_parser().parse_args([])
    args.url, args.model, args.concurrency = f"http://127.0.0.1:{port}", model, clients
    args.requests, args.max_tokens, args.duration = clients, new_tokens, 120.0
    args.ignore_eos, args.ban_tokens = decoda, []  # transformers serve has no ignore_eos; random models rarely stop
    return asyncio.run(run_load(args))


def servers(folder: Path, device: str, dtype: str, eager_too: bool) -> dict[str, tuple[list[str], str, str]]:
    """name -> (command without the port, readiness path, model name to send)."""
    python = sys.executable
    decoda = [python, "-m", "server.cli", "serve", "--model", str(folder), "--device", device, "--dtype", dtype,
              "--compile", "--max-model-len", "1024", "--max-num-seqs", "64", "--kv-cache-memory", "4GiB"]  # fmt: skip
    transformers = [python, "-c", "from transformers.cli.transformers import main; main()", "serve", str(folder),
                    "--device", device, "--dtype", dtype]  # fmt: skip
    table = {"decoda": (decoda, "/ready", folder.name)}
    if eager_too:  # the same server without its CUDA graphs: what the graphs are worth
        table["decoda (eager)"] = ([arg for arg in decoda if arg != "--compile"], "/ready", folder.name)
    table |= {
        "transformers serve --continuous-batching": (transformers + ["--continuous-batching"], "/health", str(folder)),
    }
    table["transformers serve"] = (transformers, "/health", str(folder))  # one client: no batching to show
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--models", default="smollm2,gemma3")
    parser.add_argument("--clients", default="1,16,64")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--work", type=Path, default=Path("/tmp/decoda-gpu-bench"))
    parser.add_argument("--start-timeout", type=float, default=180.0)
    parser.add_argument("--eager-too", action="store_true", help="also Decoda without --compile (no CUDA graphs)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    dtype = getattr(torch, args.dtype)
    clients = [int(c) for c in args.clients.split(",")]
    rows: list[dict] = []
    names = args.models.split(",")
    for name in names:
        folder = random_model(name, args.work, args.device, dtype)
        log(f"{name}: HF generate, one client")
        rows.append({"model": name, "server": "HF generate()", "clients": 1,
                     "tok_s": hf_generate_tok_s(folder, args.device, dtype, args.max_tokens)})  # fmt: skip
        log(f"{name}: {rows[-1]['tok_s']:.1f} tok/s")
        eager_too = args.eager_too and name == names[0]
        for server, (command, ready, model) in servers(folder, args.device, args.dtype, eager_too).items():
            port = free_port()
            log_file = args.work / f"{name}-{server.replace(' ', '').replace('-', '')}.log"
            try:
                proc = start(command + ["--port", str(port)], port, log_file, ready, args.start_timeout)
            except RuntimeError as error:
                log(f"{name} {server}: {error}")
                rows.append({"model": name, "server": server, "clients": 0, "tok_s": 0.0, "error": str(error)[-500:]})
                continue
            try:
                wanted = {"transformers serve": [1], "decoda (eager)": [1, clients[-1]]}.get(server, clients)
                load(port, model, 2, 16, server.startswith("decoda"))  # warm up: graphs, kernels, first load
                for count in wanted:
                    summary = load(port, model, count, args.max_tokens, server.startswith("decoda"))
                    rows.append({"model": name, "server": server, "clients": count, "tok_s": summary["output_tok_s"],
                                 "ttft_p50": summary["ttft_p50"], "itl_p50": summary["itl_p50"],
                                 "errors": summary["errors"], "first_error": summary["first_error"],
                                 "tokens_per_request": summary["tokens_per_request"]})  # fmt: skip
                    log(f"{name} {server} x{count}: {summary['output_tok_s']:.1f} tok/s, "
                        f"{summary['errors']} errors {summary['first_error'] or ''}")  # fmt: skip
            finally:
                stop(proc)
                tail = log_file.read_text(errors="replace").splitlines()[-40:]
                with (args.out / "servers.log").open("a") as servers_log:  # one file: what may come back is few
                    servers_log.write(f"==== {name} {server}\n" + "\n".join(tail) + "\n")
            (args.out / "gpu_bench.json").write_text(json.dumps(rows, indent=1))
    print(table(rows))
    (args.out / "gpu_bench.md").write_text(table(rows) + "\n")


def table(rows: list[dict]) -> str:
    lines = ["| model | server | clients | tok/s | TTFT p50 ms | ITL p50 ms | tokens/req | errors |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for row in rows:
        def ms(key: str, row: dict = row) -> str:
            return "-" if row.get(key) is None else f"{row[key] * 1000:.1f}"

        lines.append(f"| {row['model']} | {row['server']} | {row['clients']} | {row['tok_s']:.1f} | "
                     f"{ms('ttft_p50')} | {ms('itl_p50')} | {row.get('tokens_per_request', 0):.0f} | "
                     f"{row.get('errors', '-')} |")  # fmt: skip
    return "\n".join(lines)


if __name__ == "__main__":
    main()
