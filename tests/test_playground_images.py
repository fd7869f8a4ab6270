"""The playground's images in a real browser (headless Chromium, as tests/test_playground_browser.py):
against a fake vision-language engine, an image chosen with the Image button and one pasted into the
message box show as thumbnails and go out as chat image_url parts (data: URLs) that reach the engine;
a text-only model's page offers no image button."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import pytest

from decoding.media import ImageInput
from tests.fake_engine import FakeEngineClient
from tests.test_api_images import served
from tests.test_image_files import encoded
from tests.test_playground_browser import CHROMIUM, Session, pytestmark, sync_playwright, until  # noqa: F401

PNG = encoded("PNG")
JPEG = encoded("JPEG", (10, 10))


@pytest.fixture(scope="module")
def chromium():  # noqa: ANN201
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM)
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def vision_engine() -> FakeEngineClient:
    return FakeEngineClient(delay=0.01, takes_images=True)


@pytest.fixture(scope="module")
def vision_server(vision_engine) -> Iterator[str]:
    yield from served(vision_engine)


@pytest.fixture(scope="module")
def text_server() -> Iterator[str]:
    yield from served(FakeEngineClient(delay=0.01))


def open_page(chromium, base: str) -> tuple[object, Session]:  # noqa: ANN001
    context = chromium.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    page.set_default_timeout(30_000)
    session = Session(page, base)
    page.goto(base)
    page.wait_for_selector("body[data-ready=true]")
    return context, session


PASTE = """([name, type, b64]) => {
  const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
  const data = new DataTransfer();
  data.items.add(new File([bytes], name, { type }));
  document.querySelector("#prompt").dispatchEvent(new ClipboardEvent("paste", { clipboardData: data, bubbles: true,
                                                                               cancelable: true }));
}"""


def test_an_image_chosen_and_one_pasted_are_sent_as_image_url_parts(vision_server, vision_engine, chromium):
    context, s = open_page(chromium, vision_server)
    page = s.page
    assert page.locator("#attach").is_visible()
    page.locator("#image-file").set_input_files({"name": "cat.png", "mimeType": "image/png", "buffer": PNG})
    page.evaluate(PASTE, ["dog.jpg", "image/jpeg", base64.b64encode(JPEG).decode()])
    until(lambda: page.locator("#attachments .thumb img").count() == 2, 10, "two thumbnails")
    assert page.locator("#prompt").input_value() == ""  # the pasted image was attached, not written as text
    s.set_field("A", "max_tokens", "4")  # the fake model's context is 64
    page.fill("#prompt", "what are these?")
    s.pane("A").locator('button[data-copy="anthropic"]').click()  # the same request on the Messages API
    snippet = page.locator("#snippet textarea").input_value()
    assert '"type": "image"' in snippet and '"media_type": "image/jpeg"' in snippet, snippet[:400]
    page.locator("#snippet .close").click()
    s.send("what are these?")
    s.wait_idle()
    urls = [f"data:image/png;base64,{base64.b64encode(PNG).decode()}",
            f"data:image/jpeg;base64,{base64.b64encode(JPEG).decode()}"]  # fmt: skip
    assert s.sent[-1]["messages"][-1] == {
        "role": "user",
        "content": [
            {"type": "text", "text": "what are these?"},
            *({"type": "image_url", "image_url": {"url": u}} for u in urls),
        ],
    }
    assert vision_engine.images[-1] == [ImageInput(PNG, "messages[0].content[1]"),
                                        ImageInput(JPEG, "messages[0].content[2]")]  # fmt: skip
    user = s.pane("A").locator(".msg.user").last
    assert user.locator(".thumb img").count() == 2 and "what are these?" in user.inner_text()
    assert page.locator("#attachments").is_hidden()  # sent: the composer is empty again
    assert s.last_reply("A").get_attribute("data-state") == "done"
    s.send("and now?")  # the conversation keeps its images: the next turn sends them again
    s.wait_idle()
    assert [image.data for image in vision_engine.images[-1]] == [PNG, JPEG]
    assert s.problems == []
    context.close()


def test_a_removed_attachment_is_not_sent(vision_server, vision_engine, chromium):
    context, s = open_page(chromium, vision_server)
    page = s.page
    page.locator("#image-file").set_input_files({"name": "cat.png", "mimeType": "image/png", "buffer": PNG})
    until(lambda: page.locator("#attachments .thumb").count() == 1, 10, "the thumbnail")
    page.locator("#attachments .remove").click()
    assert page.locator("#attachments").is_hidden()
    s.set_field("A", "max_tokens", "4")
    s.send("just text")
    s.wait_idle()
    assert s.sent[-1]["messages"][-1] == {"role": "user", "content": "just text"}
    assert s.problems == []
    context.close()


def test_a_text_only_model_offers_no_image_button(text_server, chromium):
    context, s = open_page(chromium, text_server)
    assert s.page.locator("#attach").is_hidden()
    assert s.problems == []
    context.close()
