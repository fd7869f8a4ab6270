"""Issue 54's speed goals on one ``decoda serve`` process serving a vision-language model.

The model is ``loadtests.vision_folder``'s LLaVA (SmolLM2-135M's text shape behind CLIP ViT-B/16 at 224 px:
196 image tokens; random seeded weights, built once under ``~/.cache/decoda/bench-vlm/``), or ``--model FOLDER``.
Every request is a streamed chat completion, greedy, ``max_tokens`` fixed and ``ignore_eos`` (so each one
generates the same count), its images 224x224 PNG data: URLs of seeded random pixels.

- Figure A (second turn): a conversation's first turn with one image, then a second turn repeating the
  conversation (same image, the first answer) plus a new user message. Per turn: TTFT, usage's
  ``prompt_tokens_details.cached_tokens``, and how much ``decoda_images_encoded_total`` and
  ``decoda_vision_encoder_seconds_total`` (``/metrics``) moved across the turn. Goal: the second turn runs no
  vision tower (both deltas 0) and its cached tokens cover the image.
- Figure B (interference): ``--clients`` text-only clients alone (each ``--requests-per-client`` requests back to
  back), then the same text clients beside ``--clients`` clients sending images (each image request a distinct
  image, so the prefix cache cannot help; they keep sending until the text clients are done). The text clients'
  output tokens/s in each phase and their ratio (goal >= 0.8). The phases alternate over ``--rounds`` rounds (the
  order reversed every other round); each round's ratio and the median are reported, the machine drifting.

Writes ``loadtests/results/vision.md`` (the command, the CPU flags, ``uptime`` before and after, the figures).

    .venv/bin/python -m loadtests.bench_vision --rounds 2
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import re
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

import httpx
import openai

from loadtests.bench_speech import cpu_flags, sample_load
from loadtests.compare import RESULTS, cpu_summary, local_decoda, median
from loadtests.loadgen import PROMPTS, percentile
from tests.vlm_families import make_image

COUNTERS = {"images": "decoda_images_encoded_total", "vision_s": "decoda_vision_encoder_seconds_total"}
FIRST, SECOND = "What is in this picture?", "And which colour is there most of?"
ALONE, BESIDE = "text alone", "text beside images"
IMAGE_SEEDS = 1_000_000  # image seeds of figure B start here; figure A's are the round numbers


@dataclass
class Reply:
    """One streamed chat completion as a client saw it."""

    ttft: float | None
    seconds: float
    tokens: int
    cached_tokens: int
    text: str
    error: str | None = None


def data_url(seed: int, size: int = 224) -> str:
    """A seeded random ``size``x``size`` RGB image as a PNG data: URL."""
    buffer = io.BytesIO()
    make_image(seed, (size, size)).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def image_message(text: str, seed: int) -> dict:
    return {"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(seed)}},
                                        {"type": "text", "text": text}]}  # fmt: skip


async def chat(client: openai.AsyncOpenAI, model: str, messages: list[dict], max_tokens: int) -> Reply:
    """One streamed, greedy request generating exactly ``max_tokens`` tokens; a failure is recorded, not raised."""
    started = time.perf_counter()
    ttft, tokens, cached, parts = None, 0, 0, []
    try:
        stream = await client.chat.completions.create(
            model=model, messages=messages, max_tokens=max_tokens, temperature=0, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
        )  # fmt: skip
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                ttft = ttft if ttft is not None else time.perf_counter() - started
                parts.append(chunk.choices[0].delta.content)
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
                details = chunk.usage.prompt_tokens_details
                cached = (details.cached_tokens or 0) if details else 0
    except openai.OpenAIError as error:
        return Reply(ttft, time.perf_counter() - started, 0, 0, "", f"{type(error).__name__}: {error}"[:300])
    return Reply(ttft, time.perf_counter() - started, tokens, cached, "".join(parts))


def counters(url: str) -> dict[str, float]:
    """The vision counters of ``/metrics`` now."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    found = {key: re.search(rf"^{name} (\S+)$", text, re.M) for key, name in COUNTERS.items()}
    missing = [COUNTERS[key] for key, match in found.items() if match is None]
    if missing:
        raise RuntimeError(f"/metrics at {url} has no {', '.join(missing)}")
    return {key: float(match.group(1)) for key, match in found.items()}


async def measured_turn(url: str, client: openai.AsyncOpenAI, model: str, messages: list[dict],
                        max_tokens: int) -> tuple[Reply, dict[str, float]]:  # fmt: skip
    """A request alone on the server and how far the vision counters moved across it."""
    before = counters(url)
    reply = await chat(client, model, messages, max_tokens)
    after = counters(url)
    return reply, {key: after[key] - before[key] for key in COUNTERS}


async def second_turn(url: str, model: str, seed: int, max_tokens: int) -> list[dict]:
    """Figure A: a first turn about image ``seed``, then the conversation repeated with a new user message."""
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=900)
    conversation = [image_message(FIRST, seed)]
    rows = []
    for turn in (1, 2):
        reply, moved = await measured_turn(url, client, model, conversation, max_tokens)
        rows.append({"turn": turn, "prompt_messages": len(conversation), **asdict(reply), **moved})
        answer, follow_up = {"role": "assistant", "content": reply.text}, {"role": "user", "content": SECOND}
        conversation = [*conversation, answer, follow_up]
    await client.close()
    return rows


async def interference(url: str, model: str, args: argparse.Namespace, images: bool, seeds: list[int]) -> dict:
    """Figure B, one phase: ``args.clients`` text clients, beside as many image clients when ``images``.

    The text clients' tokens/s is their output tokens over the time from the phase's start to the last text
    reply. Image clients send distinct images (``seeds`` hands out the next one) until the text clients are done;
    their requests still running then are awaited, outside the measured time.
    """
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=900)
    done = asyncio.Event()

    async def text_client(k: int) -> list[Reply]:
        replies = []
        for i in range(args.requests_per_client):
            prompt = PROMPTS[(k + i) % len(PROMPTS)]
            replies.append(await chat(client, model, [{"role": "user", "content": prompt}], args.max_tokens))
        return replies

    async def image_client() -> list[Reply]:
        replies = []
        while not done.is_set():
            seeds[0] += 1
            replies.append(await chat(client, model, [image_message(FIRST, seeds[0])], args.max_tokens))
        return replies

    before = counters(url)
    started = time.perf_counter()
    image_tasks = [asyncio.create_task(image_client()) for _ in range(args.clients if images else 0)]
    text = [r for replies in await asyncio.gather(*(text_client(k) for k in range(args.clients))) for r in replies]
    wall = time.perf_counter() - started
    done.set()
    image = [r for replies in await asyncio.gather(*image_tasks) for r in replies]
    moved = {key: value - before[key] for key, value in counters(url).items()}
    await client.close()
    ok = [r for r in text if r.error is None]
    tokens = sum(r.tokens for r in ok)
    return {
        "phase": BESIDE if images else ALONE, "text_requests": len(text), "text_errors": len(text) - len(ok),
        "text_tokens": tokens, "wall_s": wall, "text_tok_s": tokens / wall if wall else 0.0,
        "text_ttft_p50": percentile([r.ttft for r in ok if r.ttft is not None], 50),
        "image_requests": len(image), "image_errors": sum(r.error is not None for r in image),
        "image_ttft_p50": percentile([r.ttft for r in image if r.ttft is not None], 50),
        "first_error": next((r.error for r in [*text, *image] if r.error), None), **moved,
    }  # fmt: skip


def image_tokens(folder: Path) -> int:
    """The placeholder tokens one image takes in the folder's LLaVA prompt (its config's ``image_seq_length``)."""
    return int(json.loads((folder / "config.json").read_text())["image_seq_length"])


def served_model(url: str) -> str:
    return httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"]


async def warm_up(url: str, model: str, max_tokens: int) -> None:
    """A text and an image request, so no figure pays the first calls' lazy work."""
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=900)
    for messages in ([{"role": "user", "content": PROMPTS[0]}], [image_message(FIRST, IMAGE_SEEDS - 1)]):
        reply = await chat(client, model, messages, max_tokens)
        if reply.error:
            raise SystemExit(f"warm-up request failed: {reply.error}")
    await client.close()


def run(args: argparse.Namespace, folder: Path, save: Callable[[dict], object] = lambda report: None) -> dict:
    """Start the server on ``folder``, measure both figures over ``args.rounds`` rounds, stop it: the report.

    ``save`` gets the report so far after every round (a long run on a busy machine, stopped part-way, keeps the
    rounds it finished)."""
    uptime_before = uptime()
    loads: list[float] = []
    stop = threading.Event()
    threading.Thread(target=sample_load, args=(loads, stop), daemon=True).start()
    flags = ["--host", "127.0.0.1", "--model", str(folder), "--max-num-seqs", str(max(64, 2 * args.clients))]
    if args.max_prefill_share is not None:
        flags += ["--max-prefill-share", str(args.max_prefill_share)]
    log = Path(args.out).parent / "logs" / "vision-server.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    second, phases, seeds = [], [], [IMAGE_SEEDS]

    def report(done: int) -> dict:
        figures = {"second_turn": second, "phases": phases, "ratios": ratios(phases), "rounds_done": done}
        return {
            "model": str(folder),
            **figures,
            "uptime_before": uptime_before,
            "uptime_after": uptime(),
            "loads": loads,
        }

    try:
        with local_decoda(flags, timeout=args.start_timeout, log=log, port=args.port) as (url, _):
            model = served_model(url)
            asyncio.run(warm_up(url, model, args.max_tokens))
            for index in range(1, args.rounds + 1):
                for row in asyncio.run(second_turn(url, model, index, args.max_tokens)):
                    second.append({"round": index, **row})
                    print(f"round {index}, turn {row['turn']}: TTFT {fmt(row['ttft'])} s, cached "
                          f"{row['cached_tokens']}, images encoded +{row['images']:g}, vision s "
                          f"+{row['vision_s']:.3f}", flush=True)  # fmt: skip
                for images in (False, True) if index % 2 else (True, False):
                    phase = asyncio.run(interference(url, model, args, images, seeds))
                    phases.append({"round": index, **phase})
                    print(f"round {index}, {phase['phase']}: {phase['text_tok_s']:.1f} text tok/s, "
                          f"{phase['image_requests']} image requests, errors {phase['text_errors']}"
                          f"+{phase['image_errors']}", flush=True)  # fmt: skip
                if index < args.rounds:
                    save(report(index))
    finally:
        stop.set()
    return report(args.rounds)


def ratios(phases: list[dict]) -> list[float]:
    """Each round's text tok/s beside images over its text tok/s alone."""
    rounds = sorted({p["round"] for p in phases})
    by = {(p["round"], p["phase"]): p["text_tok_s"] for p in phases}
    return [by[r, BESIDE] / by[r, ALONE] for r in rounds if by.get((r, ALONE)) and (r, BESIDE) in by]


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def fmt(value: float | None, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def report_lines(report: dict, args: argparse.Namespace) -> list[str]:
    """The figures: the goals' verdicts, then figure A's and figure B's tables."""
    second = report["second_turn"]
    turn2 = [r for r in second if r["turn"] == 2]
    no_tower = bool(turn2) and all(r["images"] == 0 and r["vision_s"] == 0 for r in turn2)
    covered = bool(turn2) and all(r["cached_tokens"] >= args.image_tokens for r in turn2)
    encoded = ", ".join(f"+{r['images']:g}" for r in turn2)
    tower_s = ", ".join(f"+{r['vision_s']:.3f}" for r in turn2)
    cached = ", ".join(str(r["cached_tokens"]) for r in turn2)
    each = report["ratios"]
    ratio, per_round = median(each), ", ".join(f"{x:.2f}x" for x in each)
    lines = [
        "Goals:",
        "",
        f"- second turn, same image: images encoded {encoded}, vision-tower s {tower_s}; cached tokens {cached} (the"
        f" image is {args.image_tokens} tokens; goal: no vision time, the image cached:"
        f" {'met' if no_tower and covered else 'not met'})",
        f"- text clients beside image clients: **{ratio:.2f}x** their tokens/s alone ({per_round} per round;"
        f" goal >= 0.8x: {'met' if each and ratio >= 0.8 else 'not met'})",
        "",
        "Figure A, second turn (one request at a time):",
        "",
        "| round | turn | prompt messages | TTFT s | cached tokens | images encoded (delta) | vision-tower s (delta) |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]  # fmt: skip
    for r in second:
        lines.append(f"| {r['round']} | {r['turn']} | {r['prompt_messages']} | {fmt(r['ttft'])} | {r['cached_tokens']} "
                     f"| {r['images']:g} | {r['vision_s']:.3f} |")  # fmt: skip
    lines += [
        "",
        f"Figure B, interference ({args.clients} text clients x {args.requests_per_client} requests; beside them "
        f"{args.clients} image clients, each request a new image):",
        "",
        "| round | phase | text tok/s | text TTFT p50 s | text wall s | image requests | images encoded | "
        "vision-tower s | image TTFT p50 s | errors |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]  # fmt: skip
    for p in report["phases"]:
        lines.append(f"| {p['round']} | {p['phase']} | {p['text_tok_s']:.1f} | {fmt(p['text_ttft_p50'])} | "
                     f"{p['wall_s']:.1f} | {p['image_requests']} | {p['images']:g} | {p['vision_s']:.2f} | "
                     f"{fmt(p['image_ttft_p50'])} | {p['text_errors'] + p['image_errors']} |")  # fmt: skip
    errors = [p["first_error"] for p in report["phases"] if p["first_error"]]
    errors += [r["error"] for r in second if r["error"]]
    if errors:
        lines += ["", f"First error: {errors[0]}"]
    return lines


def write_markdown(report: dict, args: argparse.Namespace, command: str, path: Path) -> Path:
    """The report: what ran where, under what load, and the figures."""
    loads = report["loads"]
    done = report["rounds_done"]
    unfinished = f" (so far: {done} of {args.rounds} rounds, the run goes on)" if done < args.rounds else ""
    sampled = f"; 1-min load sampled every 5 s: {min(loads):.2f} to {max(loads):.2f}" if loads else ""
    share = "" if args.max_prefill_share is None else f" with `--max-prefill-share {args.max_prefill_share}`"
    lines = [
        "# Vision-language serving: a repeated image's second turn, and text clients beside image clients",
        "",
        f"Measured {datetime.now(UTC):%Y-%m-%d %H:%M} UTC with `{command}`{unfinished}.",
        f"CPU: {cpu_summary()}; flags: {cpu_flags()}.",
        f"Load: `{report['uptime_before']}` before, `{report['uptime_after']}` after{sampled} (the server's own "
        "threads included; this machine is shared, so other work may have run beside the benchmark).",
        f"Model: `{report['model']}` ({args.model_title}), one `decoda serve` process{share}. Every request: streamed",
        f"chat, greedy, `max_tokens` {args.max_tokens} with `ignore_eos`; images: 224x224 random-pixel PNGs.",
        "",
        *report_lines(report, args),
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2, help="rounds of both figures (phase order alternates)")
    parser.add_argument("--clients", type=int, default=16, help="text clients, and as many image clients")
    parser.add_argument("--requests-per-client", type=int, default=4, help="requests each text client sends")
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens every request generates")
    parser.add_argument("--port", type=int, default=None, help="the server's port (default: a free one)")
    parser.add_argument("--model", default=None, help="a LLaVA folder (default: the benchmark's, built once)")
    parser.add_argument("--start-timeout", type=float, default=600, help="seconds the server may take to start")
    parser.add_argument("--out", default=str(RESULTS / "vision.md"), help="where the report goes")
    parser.add_argument("--max-prefill-share", type=float, default=None,
                        help="the server's --max-prefill-share (default: the server's own, no limit)")  # fmt: skip
    return parser


def main(argv: list[str] | None = None) -> Path:
    args = build_parser().parse_args(argv)
    from loadtests import vision_folder

    folder = Path(args.model) if args.model else vision_folder.bench_folder()
    args.image_tokens = image_tokens(folder)
    args.model_title = "a user's folder" if args.model else vision_folder.TITLE
    given = sys.argv[1:] if argv is None else argv
    command = shlex.join([Path(sys.executable).name, "-m", "loadtests.bench_vision", *given])
    report = run(args, folder, lambda partial: write_markdown(partial, args, command, Path(args.out)))
    path = write_markdown(report, args, command, Path(args.out))
    print(path.read_text())
    return path


if __name__ == "__main__":
    main()
