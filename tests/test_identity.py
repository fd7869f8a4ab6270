"""One caller identity per request, from the key that was checked: the per-key limit, a stored response's
owner and the access log all use it, so a valid ``x-api-key`` beside an invented bearer token can neither
escape ``--max-concurrency-per-key`` nor reach a revoked key's responses."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import sqlite3
import threading
import uuid
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from decoding import GenerationParams, RequestOutput
from server.app import create_app
from server.config.settings import Settings
from tests.fake_engine import FakeEngineClient
from tests.test_api import MODEL, client_for, error_of, run
from tests.threaded_server import uvicorn_in_thread

BODY = {"model": MODEL, "prompt": "hi", "max_tokens": 1}


class GatedEngine(FakeEngineClient):
    """The first generation waits for ``gate`` (``started`` says it is in flight); later ones answer at once."""

    def __init__(self) -> None:
        super().__init__()
        self.started, self.gate = threading.Event(), threading.Event()

    def generate(
        self, request_id: str, prompt_ids: list[int], params: GenerationParams
    ) -> AsyncIterator[RequestOutput]:
        first = not self.started.is_set()
        self.started.set()
        outputs = super().generate(request_id, prompt_ids, params)
        return self._held(outputs) if first else outputs

    async def _held(self, outputs: AsyncIterator[RequestOutput]) -> AsyncIterator[RequestOutput]:
        await asyncio.to_thread(self.gate.wait, 60)
        async for output in outputs:
            yield output


@pytest.fixture
def limited_server() -> Iterator[tuple[str, GatedEngine]]:
    """A real uvicorn (a thread of this process) over the gated engine: keys K1 and K2, one row per key."""
    engine = GatedEngine()
    app = create_app(Settings(api_key="K1,K2", max_concurrency_per_key=1), engine_client=engine)
    with uvicorn_in_thread(app) as base:
        yield base, engine
        engine.gate.set()


def test_an_unchecked_bearer_beside_a_valid_x_api_key_never_escapes_the_per_key_limit(limited_server):
    base, engine = limited_server

    async def go() -> tuple[httpx.Response, list[httpx.Response], list[httpx.Response], httpx.Response]:
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:

            def post(headers: dict[str, str]):  # noqa: ANN202
                return http.post("/v1/completions", json=BODY, headers=headers)

            held = asyncio.ensure_future(post({"x-api-key": "K1"}))
            assert await asyncio.to_thread(engine.started.wait, 30)  # K1's one row is taken
            invented = await asyncio.gather(*(post({"x-api-key": "K1", "Authorization": f"Bearer {uuid.uuid4()}"})
                                              for _ in range(4)))  # fmt: skip
            same_key = await asyncio.gather(post({"Authorization": "Bearer K1"}), post({"x-api-key": "K1"}),
                                            post({"x-api-key": "K1", "Authorization": "Bearer K1"}))  # fmt: skip
            other = await post({"Authorization": "Bearer K2"})
            engine.gate.set()
            return await held, invented, same_key, other

    held, invented, same_key, other = run(go())
    assert held.status_code == 200, held.text
    # previous main: each invented bearer was a caller of its own, and all four got 200
    assert [r.status_code for r in invented] == [401] * 4
    assert all("Authorization" in error_of(r)["message"] for r in invented)
    assert [r.status_code for r in same_key] == [429] * 3  # one caller, however the key is sent
    assert all(error_of(r)["code"] == "concurrency_limit" for r in same_key)
    assert other.status_code == 200  # another key has its own row


def test_two_different_valid_keys_are_a_400_naming_both_headers():
    async def go() -> list[httpx.Response]:
        async with client_for(FakeEngineClient(), api_key="K1,K2") as http:
            return [await http.post("/v1/completions", json=BODY, headers=headers) for headers in (
                {"x-api-key": "K1", "Authorization": "Bearer K2"},
                {"x-api-key": "K1", "Authorization": "Bearer K1"},
                {"x-api-key": "K1", "Authorization": "Basic czNjcmV0"},  # another scheme is not one of our keys
                {"x-api-key": "", "Authorization": "Bearer K2"},
            )]  # fmt: skip

    both, same, basic, blank = run(go())
    assert both.status_code == 400
    error = error_of(both)
    assert error["code"] == "conflicting_api_keys" and "Authorization" in error["message"]
    assert "x-api-key" in error["message"] and "K1" not in both.text and "K2" not in both.text
    assert (same.status_code, basic.status_code, blank.status_code) == (200, 200, 200)


def _responses(store: str, keys: str) -> httpx.AsyncClient:
    return client_for(FakeEngineClient(), api_key=keys, responses_store=store)


def test_a_revoked_keys_responses_are_unreachable_whatever_else_the_request_sends(tmp_path):
    store = f"sqlite:///{tmp_path / 'responses.db'}"

    async def before() -> tuple[str, int]:
        async with _responses(store, "old,K1") as http:
            made = await http.post("/v1/responses", json={"model": MODEL, "input": "hello", "max_output_tokens": 2},
                                   headers={"Authorization": "Bearer old"})  # fmt: skip
            assert made.status_code == 200, made.text
            response_id = made.json()["id"]
            others = await http.get(f"/v1/responses/{response_id}", headers={"Authorization": "Bearer K1"})
            return response_id, others.status_code

    response_id, seen_by_another_key = run(before())
    assert seen_by_another_key == 404  # a response is its key's
    with sqlite3.connect(tmp_path / "responses.db") as db:
        (owner,) = db.execute("SELECT owner FROM responses WHERE id = ?", (response_id,)).fetchone()
    assert owner == hashlib.sha256(b"old").hexdigest()  # the key's digest, never the key

    async def after() -> list[httpx.Response]:  # restarted without "old": revoked
        async with _responses(store, "K1") as http:
            return [await http.get(f"/v1/responses/{response_id}", headers=headers) for headers in (
                {"x-api-key": "K1", "Authorization": "Bearer old"},  # previous main: 200, the owner was the bearer
                {"Authorization": "Bearer old"},
                {"x-api-key": "K1"},
            )]  # fmt: skip

    smuggled, revoked, other = run(after())
    assert (smuggled.status_code, revoked.status_code, other.status_code) == (401, 401, 404)


def test_the_access_log_names_the_checked_key_by_its_digest(caplog):
    caplog.set_level(logging.INFO, logger="decoda.access")

    async def go() -> None:
        async with client_for(FakeEngineClient(), api_key="K1") as http:
            await http.post("/v1/completions", json=BODY, headers={"x-api-key": "K1"})
            await http.post("/v1/completions", json=BODY, headers={"x-api-key": "K1", "Authorization": "Bearer x"})

    run(go())
    lines = [record for record in caplog.records if record.name == "decoda.access"]
    assert [record.caller for record in lines] == [f"key:{hashlib.sha256(b'K1').hexdigest()[:12]}", "refused"]
    assert "caller=key:" in lines[0].getMessage() and "K1" not in lines[0].getMessage()
