"""Stored conversations stay bounded: a turn stores what it adds (N turns take N turns' bytes, not
N conversations'), each owner's stored bytes and items have a quota (a 429 naming it), a chain of
turns has a most, every input item is size-checked whatever the truncation, and continuing a long
conversation with ``truncation: "auto"`` never tokenizes more than the context can hold."""

from __future__ import annotations

import sqlite3

import pytest

from decoding import ModelFacts
from server.api.responses import route
from tests.test_api import error_of
from tests.test_responses_api import RESPONSES, RecordingEngine, Server, words


def stored_bytes(server: Server) -> int:
    """Every character the store file's ``responses`` rows hold (whatever its columns)."""
    db = sqlite3.connect(server.app.state.settings.responses_store_path())
    try:
        rows = db.execute("SELECT * FROM responses").fetchall()
    finally:
        db.close()
    return sum(len(value) for values in rows for value in values if isinstance(value, str))


def test_storage_grows_linearly_with_the_turns_of_a_conversation(tmp_path):
    server = Server(tmp_path)
    turn = "x" * 2000  # one token to the fake tokenizer: twelve turns fit its context
    first = server.create({"input": turn})
    one_turn = stored_bytes(server)
    previous = first["id"]
    for _ in range(11):
        previous = server.create({"input": turn, "previous_response_id": previous})["id"]
    assert 12 * one_turn * 0.9 < stored_bytes(server) < 12 * one_turn * 1.1  # a copy per turn would be ~6.5x
    messages, _ = server.engine.templates[-1]
    assert len(messages) == 23 and all(m["content"] == turn for m in messages[::2])  # the whole conversation


def test_an_owner_over_its_items_quota_is_a_429_naming_it(tmp_path):
    server = Server(tmp_path, responses_quota_items=5, api_key="alice,bob")
    kept = server.create({"input": [{"role": "user", "content": f"w{i}"} for i in range(3)]}, key="alice")  # 3 + 1
    server.create({"input": "one more"}, key="alice")  # 4 + 1 more: 6, the request counted only its input
    refused = server.call("POST", RESPONSES, {"input": "again", "max_output_tokens": 2}, key="alice")
    error = error_of(refused)
    assert refused.status_code == 429 and (error["param"], error["code"], error["type"]) == (
        "responses_quota_items", "responses_quota_exceeded", "insufficient_quota")  # fmt: skip
    assert "hold 6 items" in error["message"] and "quota of 5" in error["message"]
    assert "--responses-quota-items" in error["message"]
    assert server.create({"input": "again", "store": False}, key="alice")["store"] is False  # nothing to store
    assert server.create({"input": "again"}, key="bob")["store"] is True  # a quota is its owner's
    assert server.call("DELETE", f"{RESPONSES}/{kept['id']}", key="alice").status_code == 200
    assert server.create({"input": "again"}, key="alice")["store"] is True  # deleting made room


def test_an_owner_over_its_bytes_quota_is_a_429_naming_it(tmp_path):
    server = Server(tmp_path, responses_quota_bytes=3000)
    server.create({"input": "x" * 1500})
    refused = server.call("POST", RESPONSES, {"input": "y" * 1500, "max_output_tokens": 2})
    error = error_of(refused)
    assert refused.status_code == 429 and error["param"] == "responses_quota_bytes"
    assert "quota of 3000 (--responses-quota-bytes)" in error["message"]
    background = server.call("POST", RESPONSES, {"input": "y" * 1500, "background": True})
    assert background.status_code == 429 and error_of(background)["param"] == "responses_quota_bytes"


def test_a_conversation_has_a_most_turns(tmp_path, monkeypatch):
    monkeypatch.setattr(route, "MAX_TURNS", 3)
    server = Server(tmp_path)
    previous = server.create({"input": "hello"})["id"]
    for _ in range(2):
        previous = server.create({"input": "foo", "previous_response_id": previous})["id"]
    refused = server.call("POST", RESPONSES, {"input": "bar", "previous_response_id": previous})
    assert refused.status_code == 400 and error_of(refused)["param"] == "previous_response_id"
    assert error_of(refused)["code"] == "conversation_too_long"


def spelled_engine() -> RecordingEngine:
    """The recording engine whose tokens spell at most 4 characters: 256 characters fill its context."""
    engine = RecordingEngine()
    engine.facts = ModelFacts(vocab_size=100, max_model_len=64, num_layers=4, max_chars_per_token=4)
    return engine


@pytest.mark.parametrize("truncation", ["auto", "disabled"])
def test_every_input_item_is_size_checked_whatever_the_truncation(tmp_path, truncation):
    server = Server(tmp_path, spelled_engine())
    body = {"input": [{"role": "user", "content": words(90)}, {"role": "user", "content": "hello"}],
            "truncation": truncation, "max_output_tokens": 2}  # fmt: skip
    refused = server.call("POST", RESPONSES, body)
    assert refused.status_code == 400 and error_of(refused)["code"] == "context_length_exceeded"
    assert error_of(refused)["param"] == ("input[0]" if truncation == "auto" else "input")
    assert server.engine.templates == []  # refused before any template or tokenizer ran


def test_continuing_a_long_conversation_tokenizes_no_more_than_the_context_holds(tmp_path):
    server = Server(tmp_path, spelled_engine())
    previous = None
    for turn in range(10):  # each turn ~80 characters: the conversation ends ~4x what the context holds
        body = {"input": words(20, turn * 5), "truncation": "auto", "previous_response_id": previous}
        previous = server.create({**body, "max_output_tokens": 2})["id"]
    server.engine.templates.clear()
    server.create({"input": "hello", "previous_response_id": previous, "truncation": "auto", "max_output_tokens": 2})
    rendered = [sum(len(m["content"]) for m in messages) for messages, _ in server.engine.templates]
    assert rendered and max(rendered) <= 64 * 4  # never the whole conversation, only what may fit
    assert len(rendered) <= 5  # a bisection over what is left


def test_disabled_truncation_refuses_a_stored_conversation_too_long_before_tokenizing_it(tmp_path):
    server = Server(tmp_path, spelled_engine())
    first = server.create({"input": words(60), "max_output_tokens": 2})
    second = server.create({"input": words(60, 30), "previous_response_id": first["id"], "truncation": "auto",
                            "max_output_tokens": 2})  # fmt: skip
    server.engine.templates.clear()
    refused = server.call("POST", RESPONSES, {"input": words(10), "previous_response_id": second["id"],
                                              "max_output_tokens": 2})  # fmt: skip
    assert refused.status_code == 400 and error_of(refused)["code"] == "context_length_exceeded"
    assert server.engine.templates == []
