"""Fair limits: --max-concurrency-per-key counts the engine rows a request runs, not HTTP requests;
with API keys the API's description is behind them too unless --public-docs."""

from __future__ import annotations

import asyncio

import httpx

from tests.fake_engine import FakeEngineClient
from tests.test_api import MODEL, client_for, error_of, run
from tests.test_auth import settings_from

KEY = {"Authorization": "Bearer k1"}


def _app_settings(tmp_path, *extra: str):  # noqa: ANN202
    return settings_from(["--api-key", "k1", *extra], tmp_path=tmp_path)


def test_a_request_counts_its_rows_against_the_callers_limit(tmp_path):
    settings = _app_settings(tmp_path, "--max-concurrency-per-key", "4")

    async def go() -> tuple[httpx.Response, ...]:
        async with client_for(FakeEngineClient(delay=0.2), **vars(settings)) as http:
            def call(**body):  # noqa: ANN003, ANN202
                return http.post("/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 3, **body},
                                 headers=KEY)  # fmt: skip

            too_wide = await call(n=5)  # more rows than any caller may hold
            many_prompts = await call(prompt=["hi"] * 5)
            first = asyncio.ensure_future(call(n=3))
            await asyncio.sleep(0.1)  # it holds 3 of the caller's 4 rows
            second, third = await asyncio.gather(call(n=2), call(n=1))
            await first
            again = await call(n=4)  # everything came back
            return too_wide, many_prompts, second, third, again

    too_wide, many_prompts, second, third, again = run(go())
    assert too_wide.status_code == 400 and error_of(too_wide)["param"] == "n"
    assert "5 engine rows" in error_of(too_wide)["message"]
    assert many_prompts.status_code == 400 and error_of(many_prompts)["param"] == "prompt"
    assert second.status_code == 429 and error_of(second)["code"] == "concurrency_limit"
    assert second.headers["retry-after"] == "1"
    assert third.status_code == 200  # 3 + 1 fit
    assert again.status_code == 200


def test_beams_and_guidance_count_as_the_rows_they_run(tmp_path):
    settings = _app_settings(tmp_path, "--max-concurrency-per-key", "3")

    async def go() -> tuple[httpx.Response, httpx.Response]:
        async with client_for(FakeEngineClient(), **vars(settings)) as http:
            body = {"model": MODEL, "prompt": "hi", "max_tokens": 2}
            beams = await http.post("/v1/completions", json={**body, "num_beams": 4}, headers=KEY)
            guided = await http.post("/v1/completions", json={**body, "n": 2, "guidance_scale": 1.5}, headers=KEY)
            return beams, guided

    beams, guided = run(go())
    assert beams.status_code == 400 and error_of(beams)["param"] == "num_beams"
    assert guided.status_code == 400 and "4 engine rows" in error_of(guided)["message"]


def test_the_api_description_needs_a_key_unless_public_docs(tmp_path):
    async def fetch(settings, headers=None) -> list[int]:  # noqa: ANN001
        async with client_for(FakeEngineClient(), **vars(settings)) as http:
            return [(await http.get(p, headers=headers)).status_code for p in ("/openapi.json", "/docs", "/redoc")]

    closed = _app_settings(tmp_path)
    assert run(fetch(closed)) == [401, 401, 401]
    assert run(fetch(closed, KEY)) == [200, 200, 200]
    assert run(fetch(_app_settings(tmp_path, "--public-docs"))) == [200, 200, 200]
    assert run(fetch(settings_from([], tmp_path=tmp_path))) == [200, 200, 200]  # no keys: nothing to guard


def test_a_caller_is_its_key_whether_sent_as_bearer_or_x_api_key():
    from server.http.auth import KeyRing, identify

    keys = KeyRing.of(["k1", "k2"], [])
    bearer = identify("Bearer k1", None, keys)
    assert bearer.refused is None and bearer.identity
    assert bearer == identify(None, "k1", keys) == identify("Bearer k1", "k1", keys)
    assert bearer.identity != identify(None, "k2", keys).identity
    assert identify(None, None, keys).refused.status == 401
