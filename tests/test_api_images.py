"""Image parts on chat, Responses, Messages and /tokenize against a fake vision-language engine: each part
reaches ``apply_chat_template`` as an ``ImageInput`` naming its path, the prompt ids it returns reach
``generate`` untouched, and every hostile or refused image is a 400 naming its part."""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import quote_from_bytes

import anthropic
import httpx
import openai
import pytest

from decoding.media import ImageInput, PromptIds
from server.app import create_app
from server.cli import build_parser
from server.config.settings import Settings
from server.config.sources import load_settings
from server.translate.images import MediaPolicy
from tests.fake_engine import IMAGE_TOKEN, IMAGE_TOKENS, FakeEngineClient
from tests.test_api import MODEL, error_of, run
from tests.test_e2e_openai import free_port
from tests.test_image_files import encoded, png_declaring

PNG = encoded("PNG")
JPEG = encoded("JPEG")
CHAT, RESPONSES, MESSAGES = "/v1/chat/completions", "/v1/responses", "/v1/messages"


def data_url(data: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


def chat_image(url: str, detail: str | None = None) -> dict:
    return {"type": "image_url", "image_url": {"url": url, **({"detail": detail} if detail else {})}}


def asking(*parts: dict) -> dict:
    """A chat body whose one user turn is ``what is it?`` followed by ``parts``."""
    return {"model": MODEL, "max_tokens": 2,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "what is it?"}, *parts]}]}  # fmt: skip


def call(engine: FakeEngineClient, path: str, body: dict, tmp_path: Path | None = None, **settings: object):  # noqa: ANN201
    if tmp_path is not None:
        settings.setdefault("responses_store", f"sqlite:///{tmp_path / 'responses.db'}")

    async def go() -> httpx.Response:
        app = create_app(Settings(**settings), engine_client=engine)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
            return await http.post(path, json=body)

    return run(go())


def refused(response: httpx.Response, param: str, *words: str) -> dict:
    assert response.status_code == 400, response.text
    error = error_of(response)
    assert error["param"] == param, error
    for word in words:
        assert word in error["message"], error
    return error


def vision() -> FakeEngineClient:
    return FakeEngineClient(takes_images=True)


# ---- chat ------------------------------------------------------------------------------------------------
def test_a_chat_image_reaches_the_template_as_an_image_input_naming_its_part():
    engine = vision()
    response = call(engine, CHAT, asking(chat_image(data_url(PNG), "low"), chat_image(data_url(JPEG, "image/jpeg"))))
    assert response.status_code == 200, response.text
    assert engine.images == [[ImageInput(PNG, "messages[0].content[1]"), ImageInput(JPEG, "messages[0].content[2]")]]
    assert response.json()["usage"]["prompt_tokens"] == 3 + 2 * IMAGE_TOKENS + 1  # "what is it?", two images, prompt


def test_the_prompt_ids_the_template_returned_reach_generate_untouched():
    engine = vision()
    assert call(engine, CHAT, asking(chat_image(data_url(PNG)))).status_code == 200
    (prompt,) = engine.prompts
    assert isinstance(prompt, PromptIds) and prompt.num_images == 1
    assert engine.submitted[0][1] is prompt  # never copied: the copy would lose its images


def test_an_image_message_is_rendered_as_parts_and_a_text_message_as_before():
    class Recording(FakeEngineClient):
        async def apply_chat_template(self, messages, tools=None, **options):  # noqa: ANN001, ANN003, ANN201
            self.messages = messages
            return await super().apply_chat_template(messages, tools, **options)

    engine = Recording(takes_images=True)
    body = asking(chat_image(data_url(PNG)), {"type": "text", "text": "and this"})
    body["messages"] = [{"role": "system", "content": "be brief"}, *body["messages"]]
    assert call(engine, CHAT, body).status_code == 200
    assert engine.messages == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "what is it?"}, {"type": "image"},
                                     {"type": "text", "text": "and this"}]},
    ]  # fmt: skip


def test_a_text_only_model_refuses_an_image_naming_it():
    response = call(FakeEngineClient(), CHAT, asking(chat_image(data_url(PNG))))
    refused(response, "messages[0].content[1]", "model 'fake-model' does not take images")


def test_only_a_user_message_carries_images():
    body = asking()
    body["messages"].append({"role": "assistant", "content": [{"type": "image_url", "image_url": {"url": "x"}}]})
    body["messages"].append({"role": "user", "content": "and?"})
    refused(call(vision(), CHAT, body), "messages[1].content[0]", "only a user message carries images")


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("file:///etc/passwd", ["'file:' URLs are not taken", "data: URL"]),
        ("ftp://example.com/cat.png", ["'ftp:' URLs are not taken"]),
        ("cat.png", ["a URL without a scheme"]),
        ("data:image/png;base64,not*base64!", ["base64 does not decode"]),
        ("data:image/png;base64", ["needs a comma"]),
        ("data:image/png;base64,", ["holds no data"]),
        ("https://example.com/cat.png", ["from no host (--allowed-media-domains)", "'example.com'"]),
    ],
)
def test_urls_that_are_not_taken_are_400s_naming_the_part(url, words):
    refused(call(vision(), CHAT, asking(chat_image(url))), "messages[0].content[1]", *words)


def test_a_data_url_may_wrap_its_base64_and_be_percent_encoded_without_base64():
    engine = vision()
    encoded_ = base64.b64encode(PNG).decode()
    wrapped = "data:image/png;base64," + "\n".join(encoded_[i : i + 20] for i in range(0, len(encoded_), 20))
    plain = "data:image/png," + quote_from_bytes(PNG)
    assert call(engine, CHAT, asking(chat_image(wrapped), chat_image(plain))).status_code == 200
    assert [image.data for image in engine.images[0]] == [PNG, PNG]


def test_too_many_images_name_the_first_part_over_the_limit():
    body = asking(*[chat_image(data_url(PNG))] * 3)
    refused(call(vision(), CHAT, body, max_images_per_request=2), "messages[0].content[3]",
            "at most 2 images (--max-images-per-request)", "holds 3")  # fmt: skip
    assert call(vision(), CHAT, body, max_images_per_request=3).status_code == 200


def test_an_image_over_max_image_bytes_is_refused_before_it_is_decoded():
    big = encoded("PNG", (64, 64))
    error = refused(call(vision(), CHAT, asking(chat_image(data_url(big))), max_image_bytes=len(big) - 1),
                    "messages[0].content[1]", f"the image is {len(big)} bytes", "--max-image-bytes")  # fmt: skip
    assert error["code"] == "image_too_large"
    assert call(vision(), CHAT, asking(chat_image(data_url(big))), max_image_bytes=len(big)).status_code == 200


def test_a_decompression_bomb_and_a_truncated_image_are_400s_naming_their_part():
    bomb = chat_image(data_url(png_declaring(30000, 30000)))
    error = refused(call(vision(), CHAT, asking(chat_image(data_url(PNG)), bomb)), "messages[0].content[2]",
                    "too many pixels")  # fmt: skip
    assert error["code"] == "invalid_image"
    truncated = chat_image(data_url(encoded("PNG", (64, 64))[:-40]))
    refused(call(vision(), CHAT, asking(truncated)), "messages[0].content[1]", "truncated")
    refused(call(vision(), CHAT, asking(chat_image(data_url(b"just text")))), "messages[0].content[1]", "not an image")


def test_max_image_pixels_reaches_the_engines_config():
    assert Settings(max_image_pixels=1234).engine_config().max_image_pixels == 1234
    assert Settings().engine_config().max_image_pixels == 4096 * 4096


# ---- remote URLs ---------------------------------------------------------------------------------------
class ImageHost(BaseHTTPRequestHandler):
    """``/cat.png``: the PNG; ``/big``: 50 KiB, chunked (no length); ``/away``: a redirect to another host;
    ``/here``: a redirect to ``/cat.png``; ``/loop``: a redirect to itself; ``/slow``: no answer until the
    tests end."""

    release = threading.Event()

    def do_GET(self) -> None:  # noqa: N802
        if self.path == "/cat.png":
            self._send(200, PNG, {"Content-Length": str(len(PNG)), "Content-Type": "image/png"})
        elif self.path == "/big":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for _ in range(50):
                self.wfile.write(b"400\r\n" + b"\0" * 1024 + b"\r\n")
            self.wfile.write(b"0\r\n\r\n")
        elif self.path == "/away":
            self._send(302, b"", {"Location": "http://localhost:1/cat.png", "Content-Length": "0"})
        elif self.path == "/here":
            self._send(302, b"", {"Location": "/cat.png", "Content-Length": "0"})
        elif self.path == "/loop":
            self._send(307, b"", {"Location": "/loop", "Content-Length": "0"})
        elif self.path == "/slow":
            self.release.wait(30)
        else:
            self._send(404, b"no", {"Content-Length": "2"})

    def _send(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def image_host() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), ImageHost)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    ImageHost.release.set()
    server.shutdown()
    server.server_close()


def test_an_image_url_of_an_allowed_host_is_fetched(image_host):
    engine = vision()
    body = asking(chat_image(f"{image_host}/cat.png"), chat_image(f"{image_host}/here"))
    response = call(engine, CHAT, body, allowed_media_domains="127.0.0.1")
    assert response.status_code == 200, response.text
    assert engine.images == [[ImageInput(PNG, "messages[0].content[1]"), ImageInput(PNG, "messages[0].content[2]")]]


def test_an_image_url_is_refused_by_default_and_for_other_hosts(image_host):
    refused(call(vision(), CHAT, asking(chat_image(f"{image_host}/cat.png"))), "messages[0].content[1]",
            "--allowed-media-domains", "'127.0.0.1' is not among them")  # fmt: skip
    refused(call(vision(), CHAT, asking(chat_image(f"{image_host}/cat.png")), allowed_media_domains="example.com"),
            "messages[0].content[1]", "only from example.com")  # fmt: skip


@pytest.mark.parametrize(
    ("path", "words", "settings"),
    [
        ("/away", ["'localhost' is not among them"], {}),  # a redirect to a host not allowed is not followed
        ("/missing", ["HTTP 404"], {}),
        ("/loop", ["redirects more than 3 times"], {}),
        ("/big", ["more than", "--max-image-bytes"], {"max_image_bytes": 10_000}),  # counted while it streams
        ("/cat.png", ["--max-image-bytes"], {"max_image_bytes": len(PNG) - 1}),  # its Content-Length says so
        ("/slow", ["more than 0.3 s (--media-fetch-timeout)"], {"media_fetch_timeout": 0.3}),
    ],
)
def test_a_fetch_that_fails_is_a_400_naming_the_part(image_host, path, words, settings):
    response = call(vision(), CHAT, asking(chat_image(f"{image_host}{path}")), allowed_media_domains="127.0.0.1",
                    **settings)  # fmt: skip
    refused(response, "messages[0].content[1]", *words)


# ---- Responses --------------------------------------------------------------------------------------------
def responses_input(*parts: dict) -> list[dict]:
    return [{"role": "user", "content": [{"type": "input_text", "text": "what is it?"}, *parts]}]


def test_a_responses_input_image_reaches_the_template_naming_its_part(tmp_path):
    engine = vision()
    part = {"type": "input_image", "image_url": data_url(PNG), "detail": "high"}
    response = call(engine, RESPONSES, {"input": responses_input(part), "max_output_tokens": 2}, tmp_path)
    assert response.status_code == 200, response.text
    assert engine.images == [[ImageInput(PNG, "input[0].content[1]")]]
    assert engine.submitted[0][1] is engine.prompts[-1]
    assert response.json()["usage"]["input_tokens"] == 3 + IMAGE_TOKENS + 1


def test_a_second_turn_sends_the_stored_image_again(tmp_path):
    engine = vision()
    app = create_app(Settings(responses_store=f"sqlite:///{tmp_path / 'responses.db'}"), engine_client=engine)

    async def go() -> tuple[httpx.Response, httpx.Response, httpx.Response]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
            part = {"type": "input_image", "image_url": data_url(PNG)}
            first = await http.post(RESPONSES, json={"input": responses_input(part), "max_output_tokens": 2})
            second = await http.post(RESPONSES, json={"input": "and its colour?", "max_output_tokens": 2,
                                                      "previous_response_id": first.json()["id"]})  # fmt: skip
            listed = await http.get(f"{RESPONSES}/{first.json()['id']}/input_items")
            return first, second, listed

    first, second, listed = run(go())
    assert first.status_code == 200 and second.status_code == 200, second.text
    assert engine.images[1] == [ImageInput(PNG, "previous_response_id")]  # the same bytes, from the store
    assert engine.prompts[1].count(IMAGE_TOKEN) == IMAGE_TOKENS
    stored_part = listed.json()["data"][0]["content"][1]
    assert stored_part == {"type": "input_image", "image_url": data_url(PNG), "detail": "auto", "file_id": None}


def test_responses_image_errors_name_the_part(tmp_path):
    def create(part: dict, engine: FakeEngineClient | None = None) -> httpx.Response:
        body = {"input": responses_input(part), "max_output_tokens": 2}
        return call(engine or vision(), RESPONSES, body, tmp_path)

    refused(create({"type": "input_image", "file_id": "file-123"}), "input[0].content[1].file_id", "no files API")
    refused(create({"type": "input_image"}), "input[0].content[1]", "without image_url is not served")
    refused(create({"type": "input_image", "image_url": "file:///etc/passwd"}), "input[0].content[1]", "'file:'")
    refused(create({"type": "input_image", "image_url": data_url(PNG)}, FakeEngineClient()), "input[0].content[1]",
            "does not take images")  # fmt: skip
    bomb = {"type": "input_image", "image_url": data_url(png_declaring(30000, 30000))}
    refused(create(bomb), "input[0].content[1]", "too many pixels")
    replayed = [{"role": "assistant", "content": [{"type": "input_image", "image_url": data_url(PNG)}]},
                {"role": "user", "content": "and?"}]  # fmt: skip
    response = call(vision(), RESPONSES, {"input": replayed, "max_output_tokens": 2}, tmp_path)
    refused(response, "input[0]", "an input_image in an assistant message is not supported")


def test_responses_input_tokens_count_the_image(tmp_path):
    part = {"type": "input_image", "image_url": data_url(PNG)}
    response = call(vision(), "/v1/responses/input_tokens", {"input": responses_input(part)}, tmp_path)
    assert response.json()["input_tokens"] == 3 + IMAGE_TOKENS + 1


# ---- Messages ---------------------------------------------------------------------------------------------
def base64_block(data: bytes = PNG, media_type: str = "image/png") -> dict:
    return {"type": "image", "source": {"type": "base64", "media_type": media_type,
                                        "data": base64.b64encode(data).decode()}}  # fmt: skip


def anthropic_body(*blocks: dict) -> dict:
    return {"model": MODEL, "max_tokens": 2,
            "messages": [{"role": "user", "content": [*blocks, {"type": "text", "text": "what is it?"}]}]}  # fmt: skip


def test_a_messages_image_block_reaches_the_template_naming_its_part(image_host):
    engine = vision()
    url_block = {"type": "image", "source": {"type": "url", "url": f"{image_host}/cat.png"}}
    response = call(engine, MESSAGES, anthropic_body(base64_block(JPEG, "image/jpeg"), url_block),
                    allowed_media_domains="127.0.0.1")  # fmt: skip
    assert response.status_code == 200, response.text
    assert engine.images == [[ImageInput(JPEG, "messages[0].content[0]"), ImageInput(PNG, "messages[0].content[1]")]]
    assert engine.submitted[0][1] is engine.prompts[-1]
    counted = {key: value for key, value in anthropic_body(base64_block()).items() if key != "max_tokens"}
    count = call(vision(), "/v1/messages/count_tokens", counted)
    assert count.json() == {"input_tokens": IMAGE_TOKENS + 3 + 1}


def test_messages_image_errors_name_the_part():
    def anthropic_error(response: httpx.Response, param_words: str) -> None:
        assert response.status_code == 400, response.text
        assert param_words in response.json()["error"]["message"], response.text

    anthropic_error(call(FakeEngineClient(), MESSAGES, anthropic_body(base64_block())), "does not take images")
    file_block = {"type": "image", "source": {"type": "file", "file_id": "file_1"}}
    anthropic_error(call(vision(), MESSAGES, anthropic_body(file_block)), "no files API")
    url_block = {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.png"}}
    anthropic_error(call(vision(), MESSAGES, anthropic_body(url_block)), "--allowed-media-domains")
    bad = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "%%%"}}
    anthropic_error(call(vision(), MESSAGES, anthropic_body(bad)), "messages[0].content[0]: the data: URL's base64")
    anthropic_error(call(vision(), MESSAGES, anthropic_body(base64_block(png_declaring(30000, 30000)))),
                    "messages[0].content[0]: the image declares too many pixels")  # fmt: skip
    assistant = {"model": MODEL, "max_tokens": 2, "messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": [base64_block()]},
        {"role": "user", "content": "and?"}]}  # fmt: skip
    anthropic_error(call(vision(), MESSAGES, assistant), "only a user turn carries images")
    result = {"type": "tool_result", "tool_use_id": "t", "content": [base64_block()]}
    anthropic_error(call(vision(), MESSAGES, anthropic_body(result)), "image blocks in a tool result are not supported")


# ---- /tokenize and /v1/models ---------------------------------------------------------------------------
def test_tokenize_counts_the_image_tokens():
    response = call(vision(), "/tokenize", {"messages": asking(chat_image(data_url(PNG)))["messages"]})
    body = response.json()
    assert body["count"] == 3 + IMAGE_TOKENS + 1 and body["tokens"].count(IMAGE_TOKEN) == IMAGE_TOKENS
    refused(call(FakeEngineClient(), "/tokenize", {"messages": asking(chat_image(data_url(PNG)))["messages"]}),
            "messages[0].content[1]", "does not take images")  # fmt: skip


def test_models_say_which_take_images():
    async def listed(engine: FakeEngineClient) -> list[dict]:
        app = create_app(Settings(), engine_client=engine)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
            data = (await http.get("/v1/models")).json()["data"]
            assert (await http.get(f"/v1/models/{MODEL}")).json() == data[0]
            return data

    assert run(listed(vision()))[0]["input_modalities"] == ["text", "image"]
    assert run(listed(FakeEngineClient()))[0]["input_modalities"] == ["text"]


# ---- settings ---------------------------------------------------------------------------------------------
def test_image_settings_defaults_flags_and_start_checks():
    defaults = Settings()
    assert (defaults.max_image_bytes, defaults.max_image_pixels, defaults.max_images_per_request) == (
        20 * 1024 * 1024, 4096 * 4096, 8)  # fmt: skip
    assert (defaults.allowed_media_domains, defaults.media_fetch_timeout) == (None, 10.0)
    flags = ["--allowed-media-domains", "a.example.com", "--allowed-media-domains", "B.example.com",
             "--max-images-per-request", "2", "--media-fetch-timeout", "3"]  # fmt: skip
    args = build_parser().parse_args(["serve", *flags])
    loaded = load_settings(args, environ={})
    assert loaded.allowed_media_domains == "a.example.com,B.example.com" and loaded.max_images_per_request == 2
    policy = MediaPolicy.of(loaded)
    assert policy.hosts == ("a.example.com", "b.example.com") and policy.fetch_timeout == 3.0
    assert load_settings(environ={"DECODA_ALLOWED_MEDIA_DOMAINS": "c.example.com"}).allowed_media_domains == \
        "c.example.com"  # fmt: skip
    for bad, words in [({"allowed_media_domains": "https://images.example.com"}, "takes host names"),
                       ({"max_image_pixels": 0}, "max_image_pixels must be >= 1"),
                       ({"max_images_per_request": 0}, "max_images_per_request must be >= 1"),
                       ({"max_image_bytes": -1}, "max_image_bytes must be >= 0"),
                       ({"media_fetch_timeout": 0}, "media_fetch_timeout must be > 0")]:  # fmt: skip
        with pytest.raises(ValueError, match=words):
            Settings(**bad).check()


def test_the_contract_states_what_an_image_part_takes():
    async def schemas(engine: FakeEngineClient, **settings: object) -> dict:
        app = create_app(Settings(**settings), engine_client=engine)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
            return (await http.get("/openapi.json")).json()["components"]["schemas"]

    taken = run(schemas(vision(), max_image_bytes=1000, max_image_pixels=5000, max_images_per_request=3,
                        allowed_media_domains="images.example.com"))  # fmt: skip
    for name in ("ImageURLPart", "ImageContent", "ImageBlock"):
        text = taken[name]["description"]
        assert "at most 1000 bytes (--max-image-bytes)" in text and "at most 5000 pixels" in text
        assert "at most 3 images per request" in text and "http(s) URL of images.example.com" in text
    assert "reads no images" in run(schemas(FakeEngineClient()))["ImageURLPart"]["description"]


# ---- the SDKs, over HTTP to a real uvicorn ------------------------------------------------------------------
def served(engine: FakeEngineClient, **settings: object) -> Iterator[str]:
    """The app around ``engine`` on uvicorn in a thread (a fake engine needs no process of its own)."""
    import uvicorn

    port = free_port()
    config = uvicorn.Config(create_app(Settings(**settings), engine_client=engine), host="127.0.0.1", port=port,
                            log_level="warning")  # fmt: skip
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    for _ in range(600):  # 30 s at most
        if server.started:
            break
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(30)


@pytest.fixture(scope="module")
def sdk_engine() -> FakeEngineClient:
    return FakeEngineClient(takes_images=True)


@pytest.fixture(scope="module")
def sdk_server(sdk_engine, tmp_path_factory) -> Iterator[str]:
    store = f"sqlite:///{tmp_path_factory.mktemp('store') / 'responses.db'}"
    yield from served(sdk_engine, responses_store=store)


def test_the_openai_sdk_sends_chat_and_responses_images(sdk_server, sdk_engine):
    client = openai.OpenAI(base_url=f"{sdk_server}/v1", api_key="unused")
    reply = client.chat.completions.create(model=MODEL, max_tokens=2, messages=[{"role": "user", "content": [
        {"type": "text", "text": "what is it?"},
        {"type": "image_url", "image_url": {"url": data_url(PNG), "detail": "low"}}]}])  # fmt: skip
    assert reply.usage.prompt_tokens == 3 + IMAGE_TOKENS + 1
    assert sdk_engine.images[-1] == [ImageInput(PNG, "messages[0].content[1]")]
    first = client.responses.create(model=MODEL, max_output_tokens=2, input=[{"role": "user", "content": [
        {"type": "input_text", "text": "what is it?"},
        {"type": "input_image", "image_url": data_url(JPEG, "image/jpeg"), "detail": "auto"}]}])  # fmt: skip
    assert sdk_engine.images[-1] == [ImageInput(JPEG, "input[0].content[1]")]
    second = client.responses.create(model=MODEL, max_output_tokens=2, input="and its colour?",
                                     previous_response_id=first.id)  # fmt: skip
    assert second.usage.input_tokens > first.usage.input_tokens
    assert sdk_engine.images[-1] == [ImageInput(JPEG, "previous_response_id")]
    with pytest.raises(openai.BadRequestError) as refused_:
        client.chat.completions.create(model=MODEL, max_tokens=2, messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "file:///etc/passwd"}}]}])  # fmt: skip
    assert refused_.value.body["param"] == "messages[0].content[0]"


def test_the_anthropic_sdk_sends_an_image_block(sdk_server, sdk_engine):
    client = anthropic.Anthropic(base_url=sdk_server, api_key="unused")
    message = client.messages.create(model=MODEL, max_tokens=2, messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                     "data": base64.b64encode(PNG).decode()}},
        {"type": "text", "text": "what is it?"}]}])  # fmt: skip
    assert message.usage.input_tokens == IMAGE_TOKENS + 3 + 1
    assert sdk_engine.images[-1] == [ImageInput(PNG, "messages[0].content[0]")]
