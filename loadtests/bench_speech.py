"""Speech to text beside faster-whisper: word error rate and speed, the servers taking turns, in one run.

Servers (each started as a subprocess on its own loopback port, waited for, measured, stopped):
- Decoda: ``decoda serve --model whisper-base`` (the packaged CTranslate2 Whisper base read into
  transformers, float32 unless ``--decoda-dtype`` says otherwise) with ``--num-threads THREADS``;
- ``faster-whisper-server`` 0.0.3 (faster-whisper 1.2.1 on CTranslate2) on the same CTranslate2 folder
  (``whisper_ct2_folder``), on the CPU with ``cpu_threads: THREADS``, once per ``--fws-compute-types``
  entry (float32: the same arithmetic as Decoda's; int8: what it is usually run with). It lives in a
  virtualenv of its own: its interpreter is ``--fws-python PATH`` or ``$DECODA_FWS_PYTHON``; with neither,
  it is skipped and the report says why. It is started as ``python -m faster_whisper_server --config
  YAML``: its single-model form takes a path but no device, compute type or threads, and its API takes
  no beam width, so the YAML names two models on the one folder, ``greedy`` (``beam_size: 1``; its
  default is 5) and ``beam5``, chosen per request by its ``model_name`` form field (it reads that field,
  not OpenAI's ``model``).

Every request is the ``openai`` client's ``audio.transcriptions.create`` with ``language="en"`` and
``temperature=0`` (one pass, no fallback, no language detection: the same work on both servers); five
beams are Decoda's ``num_beams=5`` form field and faster-whisper-server's ``beam5`` model. The clips are
``loadtests.speech_clips``' (espeak-ng, ground truth known). Per server and round, after a warm-up:
the twelve clips at one client greedy (WER, clips/s), the same with five beams (WER, time per clip over
greedy's), eight clients each sending every clip in turn starting at its own (clips/s), and the 49 s
clip greedy (real-time factor: wall seconds over audio seconds), then the twelve clips streamed (OpenAI's
transcript events, read to the end), greedy and with five beams (time per clip over greedy's). The servers
take turns over ``--rounds`` rounds, the order reversed every other round; ratios are taken within a round. Writes
``loadtests/results/speech.md``.

    .venv/bin/python -m loadtests.bench_speech --fws-python ~/peers/fws/bin/python --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import openai

from loadtests.compare import ROOT, cpu_summary, free_port, resident_mb, stop_server, wait_ready
from loadtests.speech_clips import Clip, make_clips, word_error_rate

RESULTS = ROOT / "loadtests" / "results"
FWS_ENV = "DECODA_FWS_PYTHON"  # faster-whisper-server's virtualenv interpreter, when no flag names it
DECODA, FWS, MODEL = "decoda", "faster-whisper-server", "whisper-base"
CPU_FLAGS = re.compile(r"avx512[a-z_0-9]*|amx[a-z_0-9]*|avx_vnni|avx2")
METRICS = (  # row key, column title, format
    ("wer_greedy", "WER greedy", ".3f"),
    ("wer_beam", "WER 5 beams", ".3f"),
    ("clips_s_1", "clips/s, 1 client", ".2f"),
    ("clips_s_8", "clips/s, 8 clients", ".2f"),
    ("rtf_long", "RTF, 49 s clip", ".3f"),
    ("beam_over_greedy", "5 beams / greedy, s per clip", ".2f"),
    ("streamed_beam_over_greedy", "streamed: 5 beams / greedy, s per clip", ".2f"),
)


@dataclass
class Server:
    """How to start one server and what its requests add for greedy and for five beams."""

    name: str
    command: list[str]
    greedy: dict = field(default_factory=dict)
    beams: dict = field(default_factory=dict)


def fws_config(folder: Path, threads: int, compute_type: str) -> str:
    """faster-whisper-server's YAML: the CTranslate2 folder twice, greedy and five beams, on the CPU."""
    options = f"{{device: cpu, compute_type: {compute_type}, cpu_threads: {threads}}}"
    lines = ["models:"]
    for name, beams in (("greedy", 1), ("beam5", 5)):
        lines += [f"  - name: {name}", f"    path: {str(folder)!r}", f"    model_options: {options}",
                  f"    transcribe_options: {{beam_size: {beams}}}"]  # fmt: skip
    return "\n".join(lines) + "\n"


def servers(args: argparse.Namespace, config_dir: Path) -> dict[str, Server | str]:
    """Each server to measure, or a string saying why it cannot run here; ``PORT`` in a command is its port."""
    decoda = [sys.executable, "-m", "server.cli", "serve", "--host", "127.0.0.1", "--port", "PORT", "--model", MODEL,
              "--max-num-seqs", "8", "--num-threads", str(args.threads), "--dtype", args.decoda_dtype]  # fmt: skip
    found: dict[str, Server | str] = {DECODA: Server(DECODA, decoda, beams={"num_beams": 5})}
    python = args.fws_python or os.environ.get(FWS_ENV)
    for compute_type in args.fws_compute_types.split(","):
        name = f"{FWS} {compute_type}"
        if not python:
            found[name] = f"skipped: no interpreter given (--fws-python PATH or ${FWS_ENV})"
        elif not Path(python).exists():
            found[name] = f"skipped: {python} does not exist"
        else:
            config = config_dir / f"fws-{compute_type}.yaml"
            config.write_text(fws_config(args.ct2_folder(), args.threads, compute_type))
            found[name] = Server(name, [str(python), "-m", "faster_whisper_server", "--config", str(config),
                                        "--host", "127.0.0.1", "--port", "PORT"],
                                 greedy={"model_name": "greedy"}, beams={"model_name": "beam5"})  # fmt: skip
    return found


async def transcribe(client: openai.AsyncOpenAI, clip: Clip, extra: dict, stream: bool = False) -> str | None:
    """The clip's transcript, or None where the request failed; ``stream``: as OpenAI's stream events (the
    ``transcript.text.done`` event's text), read to the end."""
    try:
        reply = await client.audio.transcriptions.create(
            model=MODEL, file=(clip.path.name, clip.path.read_bytes(), "audio/wav"), language="en", temperature=0,
            extra_body=extra or None, **({"stream": True} if stream else {}),
        )  # fmt: skip
        if not stream:
            return reply.text
        text = None
        async for event in reply:
            if getattr(event, "type", None) == "transcript.text.done":
                text = event.text
        return text
    except openai.OpenAIError as error:
        print(f"  request failed ({clip.path.name}): {error}", file=sys.stderr, flush=True)
        return None


async def one_pass(url: str, clips: list[Clip], extra: dict, clients: int,
                   stream: bool = False) -> tuple[list[str | None], float]:  # fmt: skip
    """Each of ``clients`` clients sends every clip in turn, client k starting at clip k: (client 0's transcripts
    in clip order, wall seconds for all of them)."""
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=900)

    async def one_client(k: int) -> list[str | None]:
        texts: list[str | None] = [None] * len(clips)
        for j in range(len(clips)):
            i = (k + j) % len(clips)
            texts[i] = await transcribe(client, clips[i], extra, stream)
        return texts

    started = time.perf_counter()
    results = await asyncio.gather(*(one_client(k) for k in range(clients)))
    wall = time.perf_counter() - started
    await client.close()
    return results[0], wall


def scored(clips: list[Clip], texts: list[str | None]) -> tuple[float, int]:
    """(WER, failed requests): a failed request scores as an empty transcript."""
    return word_error_rate([c.text for c in clips], [t or "" for t in texts]), sum(t is None for t in texts)


def measure(server: Server, clips: list[Clip], long: Clip, args: argparse.Namespace, log_dir: Path) -> dict:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [str(port) if part == "PORT" else part for part in server.command]
    started = time.monotonic()
    with open(log_dir / f"speech-{server.name.replace(' ', '-')}.log", "w") as log:
        proc = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        try:
            problem = wait_ready(url, proc, args.start_timeout)
            if problem:
                return {"server": server.name, "problem": problem}
            ready_s = time.monotonic() - started
            for extra in (server.greedy, server.beams):  # loads, first calls: paid before the measurement
                asyncio.run(one_pass(url, clips[:1], extra, 1))
            greedy, greedy_s = asyncio.run(one_pass(url, clips, server.greedy, 1))
            beams, beams_s = asyncio.run(one_pass(url, clips, server.beams, 1))
            many, many_s = asyncio.run(one_pass(url, clips, server.greedy, 8))
            (long_text,), long_s = asyncio.run(one_pass(url, [long], server.greedy, 1))
            streamed_greedy, streamed_greedy_s = asyncio.run(one_pass(url, clips, server.greedy, 1, stream=True))
            streamed_beams, streamed_beams_s = asyncio.run(one_pass(url, clips, server.beams, 1, stream=True))
            streamed = all(streamed_greedy) and all(streamed_beams)  # a server that cannot stream: not measured
            (wer_greedy, failed_greedy), (wer_beam, failed_beam) = scored(clips, greedy), scored(clips, beams)
            row = {
                "server": server.name, "wer_greedy": wer_greedy, "wer_beam": wer_beam,
                "clips_s_1": len(clips) / greedy_s, "clips_s_8": 8 * len(clips) / many_s,
                "rtf_long": long_s / long.seconds, "beam_over_greedy": beams_s / greedy_s,
                "streamed_beam_over_greedy": streamed_beams_s / streamed_greedy_s if streamed else float("nan"),
                "wer_long": scored([long], [long_text])[0], "failed": failed_greedy + failed_beam
                + scored(clips, many)[1] + (long_text is None),
                "ready_s": ready_s, "resident_mb": resident_mb(proc.pid),
            }  # fmt: skip
            print("  " + ", ".join(f"{title} {row[key]:{fmt}}" for key, title, fmt in METRICS), flush=True)
            return row
        finally:
            stop_server(proc)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def round_ratios(rows: list[dict], key: str, numerator: str, denominator: str) -> list[float]:
    """``key`` of ``numerator`` over ``denominator`` within each round both measured."""
    by_round: dict[int, dict[str, dict]] = {}
    for row in rows:
        by_round.setdefault(row["round"], {})[row["server"]] = row
    return [r[numerator][key] / r[denominator][key] for r in by_round.values()
            if numerator in r and denominator in r and r[denominator][key]]  # fmt: skip


def goal_lines(rows: list[dict], peer: str = f"{FWS} float32") -> list[str]:
    """Each goal of issue 53 with its figure: Decoda against ``peer`` (float32: Decoda's default arithmetic)."""

    def values(server: str, key: str) -> list[float]:
        return [r[key] for r in rows if r["server"] == server]

    lines = ["Goals (Decoda against " + peer + ", medians over rounds; each round's figure in brackets):", ""]
    if not values(peer, "wer_greedy"):
        lines.append(f"- {peer} was not measured: only Decoda's own figures below.")
    for key, what in (("wer_greedy", "greedy"), ("wer_beam", "5 beams")):
        if values(peer, key):
            mine, theirs = median(values(DECODA, key)), median(values(peer, key))
            verdict = "met" if mine - theirs <= 0.02 else "not met"  # a lower WER than the peer's meets it too
            lines.append(f"- WER {what}: Decoda {mine:.3f}, peer {theirs:.3f} (difference {mine - theirs:+.3f}; "
                         f"goal: at most 0.02 above: {verdict})")  # fmt: skip
    for key, goal, what in (("clips_s_1", 0.8, "1 client"), ("clips_s_8", 1.5, "8 clients")):
        ratios = round_ratios(rows, key, DECODA, peer)
        if ratios:
            shown = ", ".join(f"{x:.2f}x" for x in ratios)
            verdict = "met" if median(ratios) >= goal else "not met"
            lines.append(
                f"- clips/s at {what}: **{median(ratios):.2f}x** the peer's ({shown}; goal >= {goal}x: {verdict})"
            )
    for server in dict.fromkeys(r["server"] for r in rows):
        rtf = values(server, "rtf_long")
        lines.append(f"- real-time factor of the 49 s clip, {server}: {median(rtf):.3f} "
                     f"({', '.join(f'{x:.3f}' for x in rtf)})")  # fmt: skip
    for key, what in (("beam_over_greedy", ""), ("streamed_beam_over_greedy", " streamed")):
        each = values(DECODA, key)
        if each:
            verdict = "met" if median(each) <= 2 else "not met"
            lines.append(f"- Decoda's 5 beams over greedy{what}, time per clip: **{median(each):.2f}x** "
                         f"({', '.join(f'{x:.2f}x' for x in each)}; goal <= 2x: {verdict})")  # fmt: skip
    return lines


def table_lines(rows: list[dict], problems: dict[str, str]) -> list[str]:
    """One line per server: each metric's median over rounds, each round's figure in brackets."""
    titles = " | ".join(title for _, title, _ in METRICS)
    lines = [f"| server | {titles} | WER 49 s clip | failed requests | resident MB | ready s |",
             "|---|" + "---:|" * (len(METRICS) + 4)]  # fmt: skip
    for server in dict.fromkeys(r["server"] for r in rows):
        mine = [r for r in rows if r["server"] == server]
        cells = []
        for key, _, fmt in METRICS:
            each = [r[key] for r in mine]
            cells.append(f"{median(each):{fmt}} ({', '.join(format(x, fmt) for x in each)})")
        rss = median([r["resident_mb"] for r in mine if r["resident_mb"] is not None])
        cells += [f"{median([r['wer_long'] for r in mine]):.3f}", str(sum(r["failed"] for r in mine)),
                  f"{rss:.0f}", f"{median([r['ready_s'] for r in mine]):.1f}"]  # fmt: skip
        lines.append(f"| {server} | " + " | ".join(cells) + " |")
    for name, problem in problems.items():
        lines.append(f"| {name} | {problem} |" + " - |" * (len(METRICS) + 3))
    return lines


def cpu_flags() -> str:
    """The instruction sets that matter to both servers' kernels (``grep -o`` of /proc/cpuinfo, sorted, unique)."""
    try:
        return " ".join(sorted(set(CPU_FLAGS.findall(Path("/proc/cpuinfo").read_text())))) or "none of them"
    except OSError:
        return "unknown"


def write_markdown(rows: list[dict], problems: dict[str, str], command: str, args: argparse.Namespace,
                   loads: list[float], clips: list[Clip], long: Clip, path: Path) -> Path:  # fmt: skip
    """The report: what was run where and under what load, the goals, the table."""
    during = loads[1:] or loads  # loads[0]: before the first server started
    load = (f"{loads[0]:.2f} before the first server started; {min(during):.2f} to {max(during):.2f} during the run"
            f" (median {median(during):.2f}, the servers' own {args.threads} threads included)")  # fmt: skip
    lines = [
        "# Speech to text: Decoda beside faster-whisper-server, same Whisper base weights",
        "",
        f"Measured {datetime.now(UTC):%Y-%m-%d %H:%M} UTC with `{command}`.",
        f"CPU: {cpu_summary()}; flags: {cpu_flags()}. Each server ran with {args.threads} threads; Decoda with "
        f"`--dtype {args.decoda_dtype}`.",
        f"Load average (1 min): {load}.",
        f"Clips: {len(clips)} espeak-ng sentences ({sum(c.seconds for c in clips):.1f} s of audio, "
        f"{min(c.seconds for c in clips):.1f} to {max(c.seconds for c in clips):.1f} s each), 16 kHz mono wav; the long"
        f" clip {long.seconds:.1f} s. Requests: `language=en`, `temperature=0`, json. WER: jiwer's corpus rate on",
        "lower-cased words without punctuation. faster-whisper-server 0.0.3 on the same CTranslate2 folder, CPU, its",
        "compute type in its name; it runs one request at a time (its endpoint calls faster-whisper inside the event",
        f"loop). The servers took turns over {args.rounds} round(s), the order reversed every other round; ratios are",
        "taken within a round.",
        "",
        *goal_lines(rows, f"{FWS} {args.fws_compute_types.split(',')[0]}"),
        "",
        *table_lines(rows, problems),
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def sample_load(loads: list[float], stop: threading.Event) -> None:
    while not stop.wait(5):
        loads.append(os.getloadavg()[0])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="turns each server takes (order reversed every other)")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="CPU threads of every server")
    parser.add_argument("--fws-python", help=f"faster-whisper-server's interpreter (else ${FWS_ENV}; neither: skipped)")
    parser.add_argument(
        "--fws-compute-types",
        default="float32,int8",
        help="faster-whisper-server compute types (the goals are taken against the first)",
    )
    parser.add_argument(
        "--decoda-dtype",
        default="float32",
        help="Decoda's --dtype (auto: bfloat16 where the CPU multiplies it natively, as with AMX)",
    )
    parser.add_argument("--servers", default=f"{DECODA},{FWS}", help="which of decoda, faster-whisper-server")
    parser.add_argument("--cache-dir", default=str(Path.home() / ".cache" / "decoda"), help="Decoda's model cache")
    parser.add_argument("--start-timeout", type=float, default=600, help="seconds a server may take to start")
    parser.add_argument("--out", default=str(RESULTS / "speech.md"), help="where the report goes")
    return parser


def main() -> None:
    args = build_parser().parse_args()

    def ct2_folder() -> Path:  # the CTranslate2 files, found (or fetched) only where the peer runs
        from decoding.model.registry import PACKAGED_MODELS
        from decoding.model.whisper_cache import whisper_ct2_folder

        return whisper_ct2_folder(PACKAGED_MODELS[MODEL], Path(args.cache_dir))

    args.ct2_folder = ct2_folder
    wanted = args.servers.split(",")
    loads: list[float] = [os.getloadavg()[0]]
    stop = threading.Event()
    threading.Thread(target=sample_load, args=(loads, stop), daemon=True).start()
    with tempfile.TemporaryDirectory(prefix="bench-speech-") as scratch:
        folder = Path(scratch)
        clips, long = make_clips(folder / "clips")
        chosen = {n: s for n, s in servers(args, folder).items() if n.split()[0] in wanted}
        problems = {n: s for n, s in chosen.items() if isinstance(s, str)}
        runnable = [s for s in chosen.values() if isinstance(s, Server)]
        log_dir = RESULTS / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        rows: list[dict] = []
        for round_index in range(args.rounds):
            for server in runnable if round_index % 2 == 0 else runnable[::-1]:
                print(f"round {round_index + 1}: {server.name}", flush=True)
                row = measure(server, clips, long, args, log_dir)
                if "problem" in row:
                    problems[server.name] = row["problem"]
                    continue
                rows.append({**row, "round": round_index + 1})
    stop.set()
    loads.append(os.getloadavg()[0])
    command = shlex.join([Path(sys.executable).name, "-m", "loadtests.bench_speech", *sys.argv[1:]])
    path = write_markdown(rows, problems, command, args, loads, clips, long, Path(args.out))
    print(path.read_text())


if __name__ == "__main__":
    main()
