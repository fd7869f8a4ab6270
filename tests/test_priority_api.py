"""``priority`` on every generation API, and the caller whose fair share a request counts in.

The real ``openai`` and ``anthropic`` clients (the field sent through ``extra_body``, as vLLM's clients
send it) against a real uvicorn over a recording fake engine: under ``--scheduling-policy priority`` the
value reaches the engine's params; a value out of its range, or not an integer, is a 400 naming it;
under the default ``fcfs`` any value but 0 is a 400 naming ``priority``, as vLLM refuses it. The caller
is the checked API key (never a body field) on a keyed server, else the end user the body names.
On the previous main ``priority`` was an unknown field (a 400 on every server).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator

import anthropic
import httpx
import openai
import pytest

from server.app import create_app
from server.config.settings import Settings
from tests.fake_engine import FakeEngineClient
from tests.threaded_server import uvicorn_in_thread

MODEL = "fake-model"
KEY = "sk-priority-test"


def served(tmp_path, **settings: object) -> Iterator[tuple[str, FakeEngineClient]]:  # noqa: ANN001
    engine = FakeEngineClient()
    app = create_app(Settings(responses_store=f"sqlite:///{tmp_path / 'r.db'}", **settings), engine_client=engine)
    with uvicorn_in_thread(app) as base:
        yield base, engine


@pytest.fixture
def priority_server(tmp_path) -> Iterator[tuple[str, FakeEngineClient]]:  # noqa: ANN001
    yield from served(tmp_path, scheduling_policy="priority")


@pytest.fixture
def fcfs_server(tmp_path) -> Iterator[tuple[str, FakeEngineClient]]:  # noqa: ANN001
    yield from served(tmp_path)


@pytest.fixture
def keyed_server(tmp_path) -> Iterator[tuple[str, FakeEngineClient]]:  # noqa: ANN001
    yield from served(tmp_path, scheduling_policy="priority", api_key=KEY)


def chat(base: str, extra: dict, key: str = "none") -> object:
    client = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0)
    return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hello"}],
                                          max_tokens=2, extra_body=extra)  # fmt: skip


def completions(base: str, extra: dict, key: str = "none") -> object:
    client = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0)
    return client.completions.create(model=MODEL, prompt="hello", max_tokens=2, extra_body=extra)


def responses(base: str, extra: dict, key: str = "none") -> object:
    client = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0)
    return client.responses.create(model=MODEL, input="hello", max_output_tokens=2, store=False, extra_body=extra)


def messages(base: str, extra: dict, key: str = "none") -> object:
    client = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0)
    return client.messages.create(model=MODEL, max_tokens=2, messages=[{"role": "user", "content": "hello"}],
                                  extra_body=extra)  # fmt: skip


APIS: dict[str, Callable[..., object]] = {
    "chat": chat, "completions": completions, "responses": responses, "messages": messages,
}  # fmt: skip
BAD_REQUEST = (openai.BadRequestError, anthropic.BadRequestError)


def error_param(error: Exception) -> tuple[str | None, str]:
    """The parameter an error names and its message: OpenAI's shape names it in ``param``; Anthropic's
    has no such member, so there the message starts with it."""
    body = error.body if isinstance(error.body, dict) else {}
    inner = body.get("error", body)
    message = inner.get("message", "")
    if isinstance(error, anthropic.BadRequestError):
        return message.split()[0].rstrip(":") if message else None, message
    return inner.get("param"), message


@pytest.mark.parametrize("api", sorted(APIS))
def test_priority_reaches_the_engine_on_every_api(priority_server, api):
    base, engine = priority_server
    APIS[api](base, {"priority": -3})
    APIS[api](base, {})
    assert [params.priority for _, _, params in engine.submitted] == [-3, 0]


@pytest.mark.parametrize("api", sorted(APIS))
@pytest.mark.parametrize("value", [2**31, -(2**31) - 1, "high", 1.5, True])
def test_a_priority_out_of_range_or_not_an_integer_is_a_400_naming_it(priority_server, api, value):
    base, engine = priority_server
    with pytest.raises(BAD_REQUEST) as refused:
        APIS[api](base, {"priority": value})
    assert error_param(refused.value)[0] == "priority"
    assert engine.submitted == []


@pytest.mark.parametrize("api", sorted(APIS))
def test_fcfs_refuses_a_priority_other_than_0_naming_it(fcfs_server, api):
    base, engine = fcfs_server
    with pytest.raises(BAD_REQUEST) as refused:
        APIS[api](base, {"priority": 1})
    param, message = error_param(refused.value)
    assert param == "priority" and "--scheduling-policy priority" in message
    APIS[api](base, {"priority": 0})
    assert [params.priority for _, _, params in engine.submitted] == [0]


def test_the_caller_is_the_end_user_the_body_names_without_keys(priority_server):
    base, engine = priority_server
    chat(base, {"user": "alice"})
    chat(base, {"safety_identifier": "bob", "user": "alice"})  # OpenAI's newer name wins
    completions(base, {"user": "carol"})
    responses(base, {"safety_identifier": "dave"})
    messages(base, {"metadata": {"user_id": "erin"}})
    chat(base, {})
    callers = [params.caller for _, _, params in engine.submitted]
    assert callers == ["user:alice", "user:bob", "user:carol", "user:dave", "user:erin", ""]


def test_the_caller_is_the_checked_key_whatever_the_body_says(keyed_server):
    base, engine = keyed_server
    chat(base, {"user": "alice"}, key=KEY)
    messages(base, {"metadata": {"user_id": "erin"}}, key=KEY)
    name = "key:" + hashlib.sha256(KEY.encode()).hexdigest()[:12]  # what the access log shows
    assert [params.caller for _, _, params in engine.submitted] == [name, name]


def test_openapi_states_priority_and_its_range(fcfs_server):
    base, _ = fcfs_server
    schemas = httpx.get(f"{base}/openapi.json").json()["components"]["schemas"]
    requests = [name for name, schema in schemas.items() if "priority" in schema.get("properties", {})]
    assert {"ChatCompletionRequest", "CompletionRequest", "ResponsesRequest", "MessagesRequest"} <= set(requests)
    for name in requests:
        prop = schemas[name]["properties"]["priority"]
        branch = next(b for b in prop.get("anyOf", [prop]) if b.get("type") == "integer")
        assert (branch["minimum"], branch["maximum"], prop.get("default", branch.get("default"))) == (
            -(2**31), 2**31 - 1, 0)  # fmt: skip
        assert "--scheduling-policy" in prop.get("description", branch.get("description", ""))
