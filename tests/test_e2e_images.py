"""Image URLs and hostile image files end to end (tests/test_e2e_vision.py holds the rest): ``decoda serve
--model FOLDER --allowed-media-domains 127.0.0.1`` on a tiny random LLaVA folder (``tests/vlm_families.py``),
driven by the real ``openai`` client. Two images, one of them fetched from an allowed host, give
``generate()``'s reply on the same images; a decompression bomb, a truncated file and text sent as an image
are the engine's 400s naming their part, a ``file://`` URL is refused, and the server serves on."""

from __future__ import annotations

import base64
import io
import threading
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import openai
import pytest

from tests import vlm_families as vf
from tests.shared_servers import SharedServers
from tests.test_image_files import png_declaring

pytestmark = pytest.mark.e2e

MAX_NEW = 8
QUESTION = "What is this?"


def png(seed: int) -> bytes:
    buffer = io.BytesIO()
    vf.make_image(seed).save(buffer, format="PNG")
    return buffer.getvalue()


def data_url(data: bytes) -> str:
    return f"data:image/png;base64,{base64.b64encode(data).decode()}"


@pytest.fixture(scope="module")
def image_files(tmp_path_factory) -> Iterator[tuple[str, Path]]:
    """A local http server holding ``cat.png`` (seed 2), as a host the server is allowed to fetch from."""
    root = tmp_path_factory.mktemp("images")
    (root / "cat.png").write_bytes(png(2))
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(SimpleHTTPRequestHandler, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", root
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[tuple[str, Path]]:
    """(base URL, folder) of a server on a tiny LLaVA that may fetch images from 127.0.0.1."""
    root = tmp_path_factory.mktemp("vlm")
    folder = vf.BY_NAME["llava"].save(root / "llava")
    servers = SharedServers(root)
    try:
        yield servers.base_url("--model", str(folder), "--allowed-media-domains", "127.0.0.1"), folder
    finally:
        servers.stop_all()


def reference(folder: Path, seeds: list[int]) -> str:
    """``generate()``'s greedy reply to QUESTION after the images, decoded as the server decodes it."""
    messages = [{"role": "user", "content": [{"type": "text", "text": QUESTION}, *[{"type": "image"}] * len(seeds)]}]
    ids = vf.hf_generate(folder, messages, [vf.make_image(seed) for seed in seeds], max_new_tokens=MAX_NEW,
                         do_sample=False)  # fmt: skip
    processor, model = vf.load(str(folder))
    eos = model.generation_config.eos_token_id
    ids = ids[: ids.index(eos)] if eos in ids else ids
    return processor.tokenizer.decode(ids, skip_special_tokens=True)


def chat_parts(*urls: str) -> list[dict]:
    return [{"type": "text", "text": QUESTION}, *({"type": "image_url", "image_url": {"url": url}} for url in urls)]


def chat_turn(*urls: str) -> list[dict]:
    return [{"role": "user", "content": chat_parts(*urls)}]


def test_two_images_and_an_allowed_url_answer_as_generate_does(served, image_files):
    base, folder = served
    host, _ = image_files
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
    chat = client.chat.completions.create(model=folder.name, max_tokens=MAX_NEW, temperature=0,
                                          messages=chat_turn(data_url(png(1)), f"{host}/cat.png"))  # fmt: skip
    assert chat.choices[0].message.content == reference(folder, [1, 2])


def test_hostile_images_are_400s_naming_their_part_and_the_server_serves_on(served):
    base, folder = served
    bodies = {
        "too many pixels": data_url(png_declaring(30000, 30000)),
        "truncated": data_url(png(1)[:-60]),
        "not an image": data_url(b"plain text, not a picture"),
    }
    for words, url in bodies.items():
        body = {"model": folder.name, "max_tokens": 2, "messages": chat_turn(url)}
        response = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=60)
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] == "messages[0].content[1]" and words in error["message"], error
    body = {"model": folder.name, "max_tokens": 2, "messages": chat_turn("file:///etc/passwd")}
    assert httpx.post(f"{base}/v1/chat/completions", json=body, timeout=60).status_code == 400
    assert httpx.get(f"{base}/health").status_code == 200
