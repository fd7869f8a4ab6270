"""The playground in a real browser: headless Chromium (Debian's ``chromium``, driven by playwright
through ``executable_path``) against a real ``decoda serve`` with the embedded model.

These check what only a browser can: the page's modules load under its Content-Security-Policy
with no console error and no request leaving the server's origin, text streams in while the
request runs, compare mode runs two strategies at once and shows their figures, the copied
snippets are requests the server accepts, a 400 lands next to the field it names, and Stop
really cancels (the server's ``decoda_num_requests_running`` drops).

Set ``DECODA_PLAYGROUND_SCREENSHOT=docs/playground-compare.png`` to save the compare-mode
screenshot the README shows.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from server.app import create_app
from server.config.settings import Settings
from tests.fake_engine import FakeEngineClient
from tests.shared_servers import PLAIN
from tests.test_e2e_openai import free_port

try:
    from playwright.sync_api import Page, sync_playwright
except ImportError:  # the test extra is not installed
    sync_playwright = None

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ROOT = Path(__file__).resolve().parent.parent
GENERATION_TIMEOUT = 180  # s: a shared 2-core CPU may be slow; the requests themselves are short

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.skipif(sync_playwright is None, reason="playwright is not installed (pip install -e '.[test]')"),
    pytest.mark.skipif(
        CHROMIUM is None, reason="no Chromium on PATH: install Debian's chromium package (.ci/run does)"
    ),
]

STRATEGY_LABELS = [
    "Greedy",
    "Sampling",
    "Beam search",
    "Beam sampling",
    "Diverse beam search",
    "Contrastive search",
    "DoLa",
    "Prompt lookup",
    "Assistant model",
    "Early exit (self-speculative)",
]


def until(predicate: Callable[[], object], timeout: float, what: str) -> None:
    """Poll from Python: playwright's in-page wait_for_function evaluates strings, which the page's
    Content-Security-Policy forbids (as it should)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def metric(base: str, name: str, labels: str = "") -> float:
    pattern = re.compile(rf"^{re.escape(name)}{re.escape(labels)} (\S+)$", re.M)
    found = pattern.search(httpx.get(f"{base}/metrics", timeout=5).text)
    return float(found.group(1)) if found else 0.0


@pytest.fixture(scope="module")
def server(shared_server) -> str:
    base = shared_server(*PLAIN)
    # a fresh server's first forward is slow (seconds of one-time setup): keep it out of the figures
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    httpx.post(f"{base}/v1/chat/completions", json=body, timeout=GENERATION_TIMEOUT).raise_for_status()
    return base


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM)
        yield chromium
        chromium.close()


class Session:
    """A page on the playground, recording what the browser reported and the requests it sent."""

    def __init__(self, page: Page, base: str) -> None:
        self.page, self.base = page, base
        self.problems: list[str] = []  # console errors, page errors, failed or foreign requests
        self.sent: list[dict] = []  # chat request bodies, in order
        page.on("console", self._console)
        page.on("pageerror", lambda e: self.problems.append(f"page error: {e}"))
        page.on("requestfailed", self._failed)
        page.on("request", self._request)

    def _console(self, message: object) -> None:
        if message.type == "error":
            self.problems.append(f"console: {message.text}")

    def _failed(self, request: object) -> None:
        if not request.url.endswith("/v1/chat/completions"):  # a stopped stream is an aborted fetch
            self.problems.append(f"request failed: {request.url} {request.failure}")

    def _request(self, request: object) -> None:
        if not request.url.startswith(self.base):
            self.problems.append(f"request outside the server: {request.url}")
        if request.url == f"{self.base}/v1/chat/completions":
            self.sent.append(json.loads(request.post_data))

    def pane(self, name: str):  # noqa: ANN201
        return self.page.locator(f'.pane[data-pane="{name}"]')

    def set_field(self, pane: str, name: str, value: str) -> None:
        self.pane(pane).locator(f'[data-param="{name}"] input').fill(value)

    def choose(self, pane: str, label: str) -> None:
        self.pane(pane).locator("select.strategy").select_option(label=label)

    def send(self, text: str) -> None:
        self.page.fill("#prompt", text)
        self.page.press("#prompt", "Enter")

    def last_reply(self, pane: str = "A"):  # noqa: ANN201
        return self.pane(pane).locator(".msg.assistant").last

    def wait_idle(self) -> None:
        until(lambda: self.page.locator("body[data-running=false]").count() == 1, GENERATION_TIMEOUT, "the replies")

    def stat(self, pane: str, key: str) -> str:
        return self.last_reply(pane).locator(f'[data-stat="{key}"] dd').inner_text()


@pytest.fixture
def session(server, browser):
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    page.set_default_timeout(30_000)
    s = Session(page, server)
    page.goto(server)
    page.wait_for_selector("body[data-ready=true]")
    yield s
    context.close()


def assert_figures(s: Session, pane: str) -> None:
    """tokens/s, time to first token and tokens generated, as the response reported them."""
    tokens = int(s.stat(pane, "tokens"))
    assert tokens > 0
    assert float(s.stat(pane, "tps")) > 0
    assert re.fullmatch(r"\d+ ms", s.stat(pane, "ttft"))
    assert s.stat(pane, "state") in ("stop", "length")


def test_page_loads_with_no_console_errors(session):
    page = session.page
    assert page.locator("#model-name").inner_text() == "smollm2-135m-instruct"
    assert page.locator('.pane[data-pane="A"] select.strategy option').all_inner_texts() == STRATEGY_LABELS
    assert page.locator('.pane[data-pane="B"]').is_hidden()
    assert page.locator('.pane[data-pane="A"] [data-group="preset"]').count() == 1  # /v1/presets answered
    session.choose("A", "Assistant model")  # no assistant loaded: a text box, not an empty list
    assert page.locator('[data-param="assistant_model"] input').get_attribute("placeholder") == "none loaded"
    assert session.problems == []


def test_narrow_window_stacks_the_panes(session):
    page = session.page
    page.set_viewport_size({"width": 400, "height": 800})
    page.click("#mode-compare")
    a = session.pane("A").bounding_box()
    b = session.pane("B").bounding_box()
    assert b["y"] >= a["y"] + a["height"]  # one column
    assert page.evaluate("document.documentElement.scrollWidth") <= 400  # nothing runs off the side
    assert session.problems == []


def test_a_prompt_streams_text_that_grows(session):
    page = session.page
    session.set_field("A", "max_tokens", "24")
    page.fill("#prompt", "Count from one to twenty in words.")
    page.press("#prompt", "Shift+Enter")  # a newline, not a send
    assert page.input_value("#prompt").endswith("\n")
    assert session.pane("A").locator(".msg").count() == 0
    page.press("#prompt", "Enter")
    reply = session.last_reply("A").locator(".content")
    lengths = []
    until(lambda: session.last_reply("A").get_attribute("data-state") == "streaming", 10, "the request to start")
    while session.last_reply("A").get_attribute("data-state") == "streaming":
        lengths.append(len(reply.inner_text()))
        time.sleep(0.02)
    lengths.append(len(reply.inner_text()))
    grew = sorted(set(lengths))
    assert len([n for n in grew if n > 0]) >= 3, f"text did not stream in pieces: {lengths}"
    assert lengths == sorted(lengths), "streamed text never shrinks"
    assert_figures(session, "A")
    first = session.sent[0]
    assert first["stream"] is True and first["do_sample"] is False and first["max_tokens"] == 24
    assert first["messages"] == [{"role": "user", "content": "Count from one to twenty in words."}]
    answer = reply.inner_text()

    session.set_field("A", "max_tokens", "4")  # a second turn carries the first one
    session.send("Thanks!")
    session.wait_idle()
    roles = [m["role"] for m in session.sent[1]["messages"]]
    assert roles == ["user", "assistant", "user"]
    assert session.sent[1]["messages"][1] == {"role": "assistant", "content": answer}
    assert session.problems == []


def test_contrastive_search_and_compare_mode(session):
    page = session.page
    session.choose("A", "Contrastive search")
    assert session.pane("A").locator('[data-param="penalty_alpha"] input').input_value() == "0.6"
    assert session.pane("A").locator('[data-param="top_k"] input').input_value() == "4"
    page.click("#mode-compare")
    assert session.pane("B").is_visible()
    session.choose("B", "Beam search")
    for pane in "AB":
        session.set_field(pane, "max_tokens", "16")
    session.send("Name three colors.")
    session.wait_idle()
    a, b = sorted(session.sent[:2], key=lambda body: "num_beams" in body)
    assert (a["penalty_alpha"], a["top_k"], a["do_sample"]) == (0.6, 4, False)
    assert (b["num_beams"], b["logprobs"]) == (4, True)  # logprobs: the server then sends sequence_score
    for pane in "AB":
        assert_figures(session, pane)
    assert float(session.stat("B", "score")) < 0  # a length-normalised log-probability

    session.choose("B", "Prompt lookup")  # second turn: the speculative figure
    session.send("Repeat exactly: the quick brown fox jumps over the lazy dog.")
    session.wait_idle()
    assert re.fullmatch(r"\d+% of \d+|no drafts", session.stat("B", "acceptance"))
    assert session.stat("B", "acceptance") != "no drafts"  # the prompt holds the whole answer
    assert [m["role"] for m in session.sent[-1]["messages"]] == ["user", "assistant", "user"]
    shot = os.environ.get("DECODA_PLAYGROUND_SCREENSHOT")
    if shot:
        page.screenshot(path=str(ROOT / shot))
    assert session.problems == []


def test_guidance_and_a_watermark_with_its_z_score_in_compare_mode(session):
    """The knobs that landed after the page (classifier-free guidance, watermarking_config) appear
    because the server's OpenAPI lists them; a watermarked reply shows the detector's z-score."""
    page = session.page
    page.click("#mode-compare")
    for pane in "AB":
        session.set_field(pane, "max_tokens", "60")
        session.pane(pane).locator('details[data-group="watermark"]').evaluate("d => d.open = true")
    session.pane("A").locator('details[data-group="guidance"]').evaluate("d => d.open = true")
    session.set_field("A", "guidance_scale", "1.5")
    session.set_field("A", "negative_prompt", "Answer rudely.")
    session.pane("B").locator('[data-param="watermarking_config"] input').check()
    session.pane("B").locator('[data-param="watermarking_config.bias"] input').fill("6")
    session.send("Write a short story about a lighthouse keeper.")
    session.wait_idle()
    a, b = sorted(session.sent[-2:], key=lambda body: "watermarking_config" in body)
    assert (a["guidance_scale"], a["negative_prompt"]) == (1.5, "Answer rudely.")
    assert "watermarking_config" not in a and b["watermarking_config"] == {"bias": 6}
    until(lambda: session.last_reply("B").locator('[data-stat="watermark"]').count() == 1, 30, "the z-score")
    assert re.fullmatch(r"z -?\d+\.\d\d · (watermarked|not detected)", session.stat("B", "watermark"))
    assert session.stat("B", "watermark").endswith("· watermarked")  # bias 6 over 60 tokens: unmistakable
    assert session.last_reply("A").locator('[data-stat="watermark"]').count() == 0
    for pane in "AB":
        assert_figures(session, pane)
    assert session.problems == []


def test_copied_snippets_are_requests_the_server_accepts(session, tmp_path):
    page = session.page
    session.choose("A", "Sampling")
    session.set_field("A", "max_tokens", "6")
    session.set_field("A", "seed", "7")
    page.fill("#system-prompt", "You are terse.")
    page.fill("#prompt", "Say hi.")

    session.pane("A").locator('[data-copy="curl"]').click()
    curl = page.locator("#snippet textarea").input_value()
    page.click("#snippet .close")
    assert curl.startswith(f"curl -N {session.base}/v1/chat/completions")
    out = subprocess.run(["bash", "-c", curl], capture_output=True, text=True, timeout=GENERATION_TIMEOUT)
    assert out.returncode == 0 and "data: [DONE]" in out.stdout, out.stdout + out.stderr

    session.pane("A").locator('[data-copy="python"]').click()
    python = page.locator("#snippet textarea").input_value()
    page.click("#snippet .close")
    assert "extra_body={" in python and '"do_sample": True' in python and "seed=7" in python
    script = tmp_path / "snippet.py"
    script.write_text(python)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=GENERATION_TIMEOUT)
    assert out.returncode == 0, out.stderr
    assert re.search(r"\d+ tokens\s*$", out.stdout)

    session.pane("A").locator('[data-copy="anthropic"]').click()
    anthropic = page.locator("#snippet textarea").input_value()
    page.click("#snippet .close")
    assert "client.messages.stream(" in anthropic and 'system="You are terse."' in anthropic
    assert '"seed": 7' in anthropic and '"do_sample": True' in anthropic
    script.write_text(anthropic)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=GENERATION_TIMEOUT)
    assert out.returncode == 0, out.stderr
    assert re.search(r"\d+ tokens\s*$", out.stdout)
    assert session.sent == []  # copying sends nothing
    assert session.problems == []


def test_reasoning_is_folded_above_the_answer(session):
    """A server with --reasoning-parser streams the thinking as delta.reasoning_content (and
    delta.reasoning, the same text): the page shows it folded above the answer, counted once."""
    chunks = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}]
    chunks += [{"choices": [{"index": 0, "delta": {"reasoning_content": part, "reasoning": part}}]}
               for part in ("The user ", "greets me.")]  # fmt: skip
    chunks += [{"choices": [{"index": 0, "delta": {"content": "Hello!"}, "finish_reason": "stop"}]},
               {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 6, "total_tokens": 9}}]  # fmt: skip
    stream = "".join(f"data: {json.dumps(chunk)}\n\n" for chunk in chunks) + "data: [DONE]\n\n"
    def answer(route: object) -> None:
        route.fulfill(status=200, content_type="text/event-stream", body=stream)

    session.page.route(f"{session.base}/v1/chat/completions", answer)
    session.send("Hi")
    session.wait_idle()
    reply = session.last_reply()
    folded = reply.locator("details.reasoning")
    assert folded.count() == 1 and folded.get_attribute("open") is None
    assert folded.locator(".reasoning-text").text_content() == "The user greets me."
    assert reply.locator(".content").first.inner_text() == "Hello!"
    folded.locator("summary").click()
    assert folded.locator(".reasoning-text").is_visible()
    assert session.problems == []


def test_invalid_combinations_show_the_server_message_next_to_the_field(session):
    page = session.page
    session.choose("A", "Contrastive search")
    session.set_field("A", "top_k", "64")
    session.send("Hello")
    error = session.pane("A").locator('[data-param="top_k"] .field-error')
    error.wait_for()
    assert error.inner_text() == "top_k for contrastive search must be at most 32, got 64"
    assert page.input_value("#prompt") == "Hello"  # kept, to send again once fixed
    assert session.pane("A").locator(".msg").count() == 0  # nothing joined the conversation

    session.set_field("A", "top_k", "8")  # editing the field clears its message
    assert error.is_hidden()

    session.choose("A", "Sampling")
    session.set_field("A", "temperature", "0")
    session.send("Hello")
    error = session.pane("A").locator('[data-param="temperature"] .field-error')
    error.wait_for()
    assert "temperature 0 means greedy decoding" in error.inner_text()

    session.pane("A").locator("details[data-group=penalties] summary").click()
    session.choose("A", "Greedy")
    session.set_field("A", "presence_penalty", "3")
    session.send("Hello")
    error = session.pane("A").locator('[data-param="presence_penalty"] .field-error')
    error.wait_for()
    assert error.inner_text() == "presence_penalty must be in [-2, 2], got 3.0"


def test_a_group_opened_just_before_a_strategy_change_stays_open(session):
    """The group's "toggle" event arrives as a later task: a strategy picked in the same task as
    the click (a fast user, a loaded machine) must not redraw the group closed (it once did)."""
    pane = session.pane("A")
    assert not pane.locator("details[data-group=penalties]").evaluate("d => d.open")
    pane.evaluate(
        """p => {
            p.querySelector("details[data-group=penalties] summary").click();
            const picker = p.querySelector("select.strategy");
            picker.value = "sampling";
            picker.dispatchEvent(new Event("change"));
        }"""
    )
    assert pane.locator("details[data-group=penalties]").evaluate("d => d.open")
    session.set_field("A", "presence_penalty", "1")  # visible: fill would time out on a closed group


def test_stop_cancels_the_request(session):
    base = session.base
    aborted = metric(base, "decoda_request_success_total", '{finished_reason="abort",strategy="greedy"}')
    session.set_field("A", "max_tokens", "600")
    session.send("Count from 1 to 300, separated by commas.")
    reply = session.last_reply("A")
    until(lambda: len(reply.locator(".content").inner_text()) > 3, GENERATION_TIMEOUT, "the first text")
    until(lambda: metric(base, "decoda_num_requests_running") == 1, 10, "the request to be running")
    session.page.click("#stop")
    until(lambda: metric(base, "decoda_num_requests_running") == 0, 15, "the server to free the request")
    assert reply.get_attribute("data-state") == "stopped"
    assert session.stat("A", "state") == "stopped"
    aborted_now = metric(base, "decoda_request_success_total", '{finished_reason="abort",strategy="greedy"}')
    assert aborted_now == aborted + 1
    assert session.page.locator("#send").is_enabled()
    assert session.problems == []


@pytest.fixture(scope="module")
def guarded_server():
    """A fake engine behind an API key, on a server that lists its presets (the bundled
    config/presets), and the page's way in when keys are required."""
    import uvicorn

    app = create_app(Settings(api_key="secret"), engine_client=FakeEngineClient(delay=0.01))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    until(lambda: server.started, 30, "the fake server")
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(30)


def test_an_api_key_and_the_preset_picker(guarded_server, browser):
    context = browser.new_context()
    page = context.new_page()
    s = Session(page, guarded_server)
    page.goto(guarded_server)
    page.locator("#notice").wait_for()
    assert "API key" in page.locator("#notice").inner_text()  # /v1/models answered 401
    page.fill("#api-key", "secret")
    page.press("#api-key", "Tab")  # commits the field
    page.wait_for_selector("body[data-ready=true]")
    assert page.locator("#model-name").inner_text() == "fake-model"
    assert page.locator("#notice").is_hidden()
    preset = s.pane("A").locator('[data-param="generation_preset"] select')
    shipped = sorted(path.stem for path in (ROOT / "config" / "presets").glob("*.json"))
    assert preset.locator("option").all_inner_texts() == ["none", *shipped]
    preset.select_option("creative")
    s.set_field("A", "max_tokens", "8")  # the fake model's context is 64
    requests = []
    page.on("request", lambda r: r.url.endswith("/v1/chat/completions") and requests.append(r.headers))
    s.send("hello world")
    s.wait_idle()
    assert s.sent[-1]["generation_preset"] == "creative"
    assert requests[-1]["authorization"] == "Bearer secret"
    assert s.last_reply("A").get_attribute("data-state") == "done"  # the server applied the preset
    context.close()


def test_a_response_format_schema_shapes_the_reply_under_beam_search(session):
    """The Response format group sends OpenAI's json_schema format; the reply is JSON that
    validates, with a strategy the peers refuse to constrain (beam search); a schema the server
    cannot compile shows its message next to the box."""
    import jsonschema

    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]}
    session.choose("A", "Beam search")
    session.set_field("A", "max_tokens", "60")
    session.pane("A").locator('details[data-group="response_format"]').evaluate("d => d.open = true")
    box = session.pane("A").locator('[data-param="response_format"] textarea')
    box.fill(json.dumps(schema))
    session.send("Name a city in Norway, as JSON.")
    session.wait_idle()
    sent = session.sent[-1]["response_format"]
    assert sent == {"type": "json_schema", "json_schema": {"name": "playground", "schema": schema, "strict": True}}
    reply = session.last_reply("A").locator(".content").inner_text()
    jsonschema.validate(json.loads(reply), schema)
    box.fill('{"type": "strin"}')
    session.send("Again.")
    error = session.pane("A").locator('[data-param="response_format"] .field-error')
    until(lambda: error.is_visible(), 30, "the error next to the schema box")
    assert "strin" in error.inner_text()


def test_tool_calls_show_under_the_reply(session):
    city = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]}
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": city}}]
    session.set_field("A", "max_tokens", "60")
    session.pane("A").locator('details[data-group="tools"]').evaluate("d => d.open = true")
    session.pane("A").locator('[data-param="tools"] textarea').fill(json.dumps(tools))
    session.pane("A").locator('[data-param="tool_choice"] select').select_option("required")
    # one call: with parallel calls the small model writes a second one until max_tokens cuts it ("length")
    session.pane("A").locator('[data-param="parallel_tool_calls"] select').select_option("false")
    session.send("What is the weather in Bergen?")
    session.wait_idle()
    assert session.sent[-1]["tools"] == tools and session.sent[-1]["tool_choice"] == "required"
    assert session.sent[-1]["parallel_tool_calls"] is False
    call = session.last_reply("A").locator(".tool-call").first.inner_text()
    assert re.fullmatch(r'tool call: get_weather\(\{"city": ".+"\}\)', call), call
    assert session.stat("A", "state") == "tool_calls"
    assert session.problems == []
