"""``GET /v1/responses/{id}?stream=true&starting_after=N``: sequence numbers start at 0, so a negative
``starting_after`` is a 400 naming it (previous main replayed only the last events), as OpenAI's."""

from __future__ import annotations

import asyncio

import httpx

from server.app import create_app
from server.config.settings import Settings
from tests.fake_engine import FakeEngineClient
from tests.test_api import MODEL, error_of, run
from tests.test_responses_api import sse_events


def test_a_negative_starting_after_is_a_400_naming_it(tmp_path):
    app = create_app(Settings(responses_store=f"sqlite:///{tmp_path / 'r.db'}"), engine_client=FakeEngineClient())

    async def go() -> tuple[httpx.Response, list, httpx.Response]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
            made = await http.post("/v1/responses", json={"model": MODEL, "input": "hello", "background": True,
                                                          "max_output_tokens": 3})  # fmt: skip
            response_id = made.json()["id"]
            for _ in range(200):  # until the run has ended: its events are all stored
                polled = (await http.get(f"/v1/responses/{response_id}")).json()
                if polled["status"] not in ("queued", "in_progress"):
                    break
                await asyncio.sleep(0.02)
            url = f"/v1/responses/{response_id}?stream=true&starting_after="
            return await http.get(url + "-5"), sse_events((await http.get(url + "0")).text), await http.get(url + "x")

    negative, after_first, not_a_number = run(go())
    assert negative.status_code == 400
    error = error_of(negative)
    assert error["param"] == "starting_after" and "greater than or equal to 0" in error["message"]
    assert after_first and after_first[0][1]["sequence_number"] == 1  # a valid one still replays from there
    assert not_a_number.status_code == 400 and error_of(not_a_number)["param"] == "starting_after"
