"""Time to ready, disk written and resident memory of a model's start: cold (the GGUF present, nothing
else cached), then warm (its cached config and tokenizer found), as ``decoda serve`` runs them.

    .venv/bin/python -m loadtests.bench_load --model qwen2.5-coder-1.5b [--gguf PATH] [-- serve flags]

A fresh cache folder is made for the run, and the model's GGUF is hard-linked into it where the
server looks for a fetched file (``<cache>/gguf/<name>``: nothing copied), so the cold start reads the
file's metadata and writes what it keeps, as on a machine where the model was just fetched. Disk
written: the bytes the cache folder gained beyond that link. Resident: the server's VmRSS once
``/ready`` answers (the KV cache pool included). CPU seconds to ready: the server's user + system
time, which other work on a shared machine does not inflate as it does the wall time. ``--gguf``:
the file to link (default: the copy a previous fetch left in ``~/.cache/decoda/gguf``); an
installed or file model is served as it is.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from loadtests.compare import free_port, resident_mb, stop_server

ROOT = Path(__file__).resolve().parent.parent


def start(
    model: str, cache: Path, flags: list[str], timeout: float, log_path: Path
) -> tuple[float, float, subprocess.Popen]:
    """(seconds to /ready, VmRSS MB at ready, the process), the server still running; its log in ``log_path``."""
    port = free_port()
    command = [sys.executable, "-m", "server.cli", "serve", "--model", model, "--port", str(port),
               "--cache-dir", str(cache), *flags]  # fmt: skip
    log = log_path.open("w")
    started = time.monotonic()
    proc = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    while not _ready(port):
        if proc.poll() is not None or time.monotonic() - started > timeout:
            proc.kill()
            raise SystemExit(f"{model}: not ready (exit code {proc.poll()}); see {log.name}")
        time.sleep(0.2)
    return time.monotonic() - started, resident_mb(proc.pid) or 0.0, proc


def cpu_seconds(pid: int) -> float:
    """User + system CPU time the process has used (its threads included): what a start costs whatever
    else the machine runs, where wall time on a shared machine also counts the others' turns."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _ready(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/ready", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def folder_bytes(folder: Path) -> int:
    """Bytes held by the files under ``folder``, each hard-linked inode counted once."""
    seen: set[int] = set()
    total = 0
    for path in folder.rglob("*"):
        if path.is_file() and path.stat().st_ino not in seen:
            seen.add(path.stat().st_ino)
            total += path.stat().st_size
    return total


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--gguf", default=None, help="the fetched GGUF to link into the fresh cache")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("flags", nargs="*", help="more decoda serve flags (after --)")
    args = parser.parse_args(argv)
    from decoding.model.registry import PACKAGED_MODELS

    work = Path(tempfile.mkdtemp(prefix="bench-load-"))
    logs = Path(tempfile.mkdtemp(prefix="bench-load-logs-"))  # kept: where each start spent its time
    cache = work / "cache"
    packaged = PACKAGED_MODELS.get(args.model)
    linked = 0
    if packaged is not None and packaged.fetch_version is not None:
        source = Path(args.gguf or Path.home() / ".cache" / "decoda" / "gguf" / packaged.gguf_name)
        (cache / "gguf").mkdir(parents=True)
        os.link(source, cache / "gguf" / packaged.gguf_name)  # same volume: nothing copied
        linked = source.stat().st_size
    try:
        cold_s, cold_mb, proc = start(args.model, cache, args.flags, args.timeout, logs / "cold.log")
        cold_cpu = cpu_seconds(proc.pid)
        stop_server(proc, 60)
        written = folder_bytes(cache) - linked
        warm_s, warm_mb, proc = start(args.model, cache, args.flags, args.timeout, logs / "warm.log")
        warm_cpu = cpu_seconds(proc.pid)
        stop_server(proc, 60)
    finally:
        load = os.getloadavg()
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps({
        "model": args.model, "flags": args.flags, "cold_ready_s": round(cold_s, 1), "warm_ready_s": round(warm_s, 1),
        "cpu_s_to_ready": {"cold": round(cold_cpu, 1), "warm": round(warm_cpu, 1)},
        "disk_written_mb": round(written / 1e6, 1), "gguf_mb": round(linked / 1e6, 1),
        "rss_at_ready_mb": {"cold": round(cold_mb), "warm": round(warm_mb)}, "load_average_after": load,
        "logs": str(logs),
    }, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
