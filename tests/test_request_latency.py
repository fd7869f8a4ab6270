"""Latency by priority and by caller (``server/http/request_latency.py``), read from /metrics as a scraper does.

Requests go through the real app (auth, translation, the one submit path) to the fake engine; the four
histograms are parsed from the exposition. What matters: each engine request is observed once under the
labels of its priority and its caller, and the label sets stay bounded whatever the bodies say (a client
inventing end users or priorities adds no series).
"""

from __future__ import annotations

import asyncio
import hashlib

import httpx
from prometheus_client.parser import text_string_to_metric_families

from server.app import create_app
from server.config.settings import Settings
from server.http.request_latency import MAX_CALLER_LABELS, CallerLabels, priority_label
from tests.fake_engine import FakeEngineClient

MODEL = "fake-model"
TTFT_PRIORITY = "decoda_time_to_first_token_by_priority_seconds"
E2E_PRIORITY = "decoda_e2e_request_latency_by_priority_seconds"
TTFT_CALLER = "decoda_time_to_first_token_by_caller_seconds"
E2E_CALLER = "decoda_e2e_request_latency_by_caller_seconds"


def key_caller(key: str) -> str:
    return f"key:{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def counts(exposition: str, family: str, label: str) -> dict[str, float]:
    """label value -> observations of ``family`` (its _count samples)."""
    found: dict[str, float] = {}
    for metric in text_string_to_metric_families(exposition):
        for sample in metric.samples:
            if sample.name == f"{family}_count":
                found[sample.labels[label]] = sample.value
    return found


def run(requests: list[tuple[str, dict, dict]], engine: FakeEngineClient | None = None, **settings: object) -> str:
    """POST each (path, body, headers) to a fresh app; the /metrics text after them."""
    app = create_app(Settings(**settings), engine_client=engine or FakeEngineClient())

    async def go() -> str:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            for path, body, headers in requests:
                response = await http.post(path, json=body, headers=headers)
                assert response.status_code in (200, 500), response.text
            return (await http.get("/metrics", headers=requests[0][2] if requests else {})).text

    return asyncio.run(go())


def completion(priority: int = 0, key: str | None = None, **fields: object) -> tuple[str, dict, dict]:
    body = {"model": MODEL, "prompt": "hello world", "max_tokens": 2, "priority": priority, **fields}
    return "/v1/completions", body, ({"Authorization": f"Bearer {key}"} if key else {})


def test_each_request_is_observed_under_its_priority():
    text = run([completion(0), completion(0), completion(3), completion(-2), completion(50), completion(-(2**31))],
               scheduling_policy="priority")  # fmt: skip
    expected = {"0": 2, "3": 1, "-2": 1, ">10": 1, "<-10": 1}
    assert counts(text, TTFT_PRIORITY, "priority") == expected
    assert counts(text, E2E_PRIORITY, "priority") == expected


def test_callers_are_the_configured_keys_and_the_weighted_names():
    weighted = "gamma"
    text = run([completion(key="alpha"), completion(key="alpha"), completion(key="beta"), completion(key=weighted)],
               api_key="alpha,beta,gamma", caller_weights=f"{key_caller(weighted)}=4")  # fmt: skip
    expected = {key_caller("alpha"): 2, key_caller("beta"): 1, key_caller(weighted): 1}
    assert counts(text, TTFT_CALLER, "caller") == expected
    assert counts(text, E2E_CALLER, "caller") == expected
    assert not [label for label in expected if "alpha" in label or "beta" in label]  # never the key itself


def test_end_users_a_body_names_are_labelled_only_when_configured():
    """Without keys the scheduler's caller is the body's ``user``: a client's word, so it is a label only
    when --caller-weights names it; any other is "other", and a request naming nobody is "anonymous"."""
    invented = [completion(user=f"visitor-{i}") for i in range(40)]
    text = run([*invented, completion(user="alice"), completion(), completion(user="alice")],
               caller_weights="user:alice=2")  # fmt: skip
    assert counts(text, TTFT_CALLER, "caller") == {"other": 40, "user:alice": 2, "anonymous": 1}


def test_several_prompts_are_observed_once_each_and_a_failed_request_not_end_to_end():
    text = run([completion(prompt=["hello", "hello world"])])
    assert counts(text, TTFT_PRIORITY, "priority") == {"0": 2}
    assert counts(text, E2E_CALLER, "caller") == {"anonymous": 2}
    failed = run([completion()], engine=FakeEngineClient(fail=True))
    assert counts(failed, E2E_PRIORITY, "priority") == {} and counts(failed, TTFT_PRIORITY, "priority") == {}


def test_labels_are_bounded():
    assert [priority_label(p) for p in (-(2**31), -11, -10, 0, 10, 11, 2**31 - 1)] == [
        "<-10", "<-10", "-10", "0", "10", ">10", ">10"]  # fmt: skip
    many = CallerLabels(f"key:{i:012x}" for i in range(MAX_CALLER_LABELS + 10))
    labels = {many.label(f"key:{i:012x}") for i in range(MAX_CALLER_LABELS + 10)}
    assert len(labels) == MAX_CALLER_LABELS + 1 and "other" in labels
