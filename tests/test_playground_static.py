"""The playground's files over HTTP (no browser): served at / with a policy that keeps them offline,
every module they import present, every field they send one the API accepts, and
``--no-playground`` leaving the API alone."""

from __future__ import annotations

import asyncio
import fnmatch
import re
import tomllib
from pathlib import Path

import httpx
import pytest

from server.api.chat.protocol import ChatCompletionRequest
from server.app import create_app
from server.cli import build_parser
from server.config.settings import Settings
from server.config.sources import load_settings
from server.playground import STATIC_DIR, static_files
from server.translate.watermark import WatermarkingConfigBody
from tests.fake_engine import FakeEngineClient

ROOT = Path(__file__).resolve().parent.parent
SVG_NAMESPACE = "http://www.w3.org/2000/svg"  # a name, never fetched


def get(path: str, **settings: object) -> httpx.Response:
    async def go() -> httpx.Response:
        app = create_app(Settings(**settings), engine_client=FakeEngineClient())
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
            return await http.get(path)

    return asyncio.run(go())


def references(text: str) -> list[str]:
    """Local files a page or module loads: src/href attributes and ES module imports."""
    found = re.findall(r'(?:src|href)="(/static/[^"]+)"', text)
    found += re.findall(r'^import [^;]*? from "\./([^"]+)";$', text, re.M)
    return found


def test_the_page_is_served_at_the_root_with_an_offline_policy():
    r = get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    policy = r.headers["content-security-policy"]
    assert "default-src 'self'" in policy and "connect-src 'self'" in policy
    assert '<script type="module" src="/static/js/main.js">' in r.text


def test_every_file_the_page_loads_is_served_with_its_type():
    pending = references(get("/").text)
    seen = set()
    while pending:
        ref = pending.pop()
        path = ref if ref.startswith("/static/") else f"/static/js/{ref}"
        if path in seen:
            continue
        seen.add(path)
        r = get(path)
        assert r.status_code == 200, path
        kind = {".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}[Path(path).suffix]
        assert r.headers["content-type"].startswith(kind), path
        pending += references(r.text)
    assert {p.removeprefix("/static/") for p in seen} == set(static_files()) - {"index.html"}  # nothing unused


def test_no_file_reaches_for_the_network():
    for name, path in static_files().items():
        text = path.read_text().replace(SVG_NAMESPACE, "")
        assert not re.search(r"https?://|//cdn|@import", text), name


@pytest.mark.parametrize("path", ["/static/nope.js", "/static/../server/app.py", "/static/%2e%2e/server/app.py"])
def test_only_the_playground_files_are_served(path):
    r = get(path)
    assert r.status_code == 404
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}


def test_no_playground_serves_the_api_only():
    settings = load_settings(build_parser().parse_args(["serve", "--no-playground"]), environ={})
    assert settings.playground is False
    assert get("/", playground=False).status_code == 404
    assert get("/static/js/main.js", playground=False).status_code == 404
    assert get("/v1/models", playground=False).status_code == 200
    assert load_settings(build_parser().parse_args(["serve"]), environ={}).playground is True


def test_every_field_the_page_sends_is_one_the_api_accepts():
    """knobs.js names each knob by its request field; a rename in a server/api/*/protocol.py must not leave
    the page sending a field the server rejects as unknown."""
    knobs = (STATIC_DIR / "js" / "knobs.js").read_text()
    fields = knobs[knobs.index("export const FIELDS") : knobs.index("};\n")]
    entries = re.findall(r"^  (\w+): \{(.*)$", fields, re.M)  # name and nest sit on an entry's first line
    names, nested = set(), set()
    for key, line in entries:
        name = re.search(r'name: "(\w+)"', line)
        nest = re.search(r'nest: "(\w+)"', line)
        if nest:  # sent inside an object field: watermarking_config's own keys
            assert nest.group(1) == "watermarking_config", key
            nested.add(name.group(1))
        else:
            names.add(name.group(1) if name else key)
    fixed = set(re.findall(r"fixed: \{ (\w+):", knobs))
    sent = names | fixed | {"model", "messages", "stream", "stream_options", "logprobs"}
    assert len(entries) > 25 and "top_k" in names and "contrastive_top_k" not in names
    assert sent <= set(ChatCompletionRequest.model_fields)
    assert nested and nested <= set(WatermarkingConfigBody.model_fields)


def test_the_package_ships_the_static_files():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    globs = pyproject["tool"]["setuptools"]["package-data"]["server.playground"]
    for name in static_files():
        assert any(fnmatch.fnmatch(f"static/{name}", g) for g in globs), name
