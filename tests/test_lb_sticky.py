"""Sticky routing through real nginx (``deploy/nginx.conf`` with ``deploy/nginx_session.js``) in front of two real
replicas: a conversation's turns land on one replica, whose prefix cache serves them; sessions spread.

The key is a request's ``X-Session-Id`` header, else its body's ``prompt_cache_key``, else the conversation
tag of its ``previous_response_id`` (the Responses API's ids keep it: ``server/api/responses/ids.py``);
requests without one are balanced by connections as before. Which replica answered each request is read
from nginx's access log (``upstream=`` beside the request id the client sent); that the replica's cache
served the earlier turns, from the answer's own usage (``cached_tokens``). The Responses conversation
needs one store for both replicas (``DECODA_TEST_POSTGRES_URL``): its first turn may be answered by the
other replica.
"""

from __future__ import annotations

import re
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from openai import OpenAI

from tests.postgres import POSTGRES_URL, SKIP_REASON, fresh_schema
from tests.test_e2e_openai import MODEL, free_port, stop_server
from tests.test_lb_nginx_drain import NGINX, nginx_conf, wait_ready
from tests.test_lb_responses import start_replicas

pytestmark = [
    pytest.mark.slow,
    pytest.mark.e2e,
    pytest.mark.skipif(NGINX is None, reason="nginx with njs is not installed (Debian packages nginx and "
                       "libnginx-mod-http-js; .ci/run installs them)"),
]  # fmt: skip

SYSTEM = "You are a helpful assistant. Answer in one short sentence."
QUESTIONS = ["Name a fruit.", "What colour is it?", "Where does it grow?", "Name another one."]
TURN = {"model": MODEL, "max_tokens": 8, "temperature": 0}


class Balancer:
    """Two replicas behind nginx; ``served_by(request_id)``: the port of the replica that answered it."""

    def __init__(self, folder: Path, replicas: list[tuple[str, subprocess.Popen]], nginx: subprocess.Popen,
                 url: str) -> None:  # fmt: skip
        self.folder, self.replicas, self.nginx, self.url = folder, replicas, nginx, url
        self.ports = [int(base.rsplit(":", 1)[1]) for base, _ in replicas]
        self.client = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300)

    def served_by(self, request_id: str) -> int:
        """nginx logs a request once its answer has gone out, which the client may have read already."""
        deadline = time.monotonic() + 10
        while True:
            log = (self.folder / "access.log").read_text()
            ports = re.findall(rf"upstream=127\.0\.0\.1:(\d+) request_id={re.escape(request_id)}$", log, re.M)
            if ports or time.monotonic() > deadline:
                (port,) = ports
                return int(port)
            time.sleep(0.05)


@pytest.fixture(scope="module")
def balancer(smollm2, tmp_path_factory) -> Iterator[Balancer]:
    folder = tmp_path_factory.mktemp("sticky")
    with ExitStack() as stack:
        # one store for both replicas where PostgreSQL is at hand (the Responses test needs it)
        store = ("--responses-store", stack.enter_context(fresh_schema())) if POSTGRES_URL else ()
        replicas = start_replicas("--max-model-len", "1024", "--num-threads", "1", *store)
        listen = free_port()
        conf = nginx_conf(folder, listen, [int(base.rsplit(":", 1)[1]) for base, _ in replicas])
        nginx = subprocess.Popen([NGINX, "-p", str(folder), "-c", str(conf), "-g", "daemon off;"])
        url = f"http://127.0.0.1:{listen}"
        try:
            wait_ready(url)
            yield Balancer(folder, replicas, nginx, url)
        finally:
            nginx.send_signal(signal.SIGQUIT)
            nginx.wait(10)
            for _, proc in replicas:
                stop_server(proc)


def chat_conversation(lb: Balancer, name: str, **session: object) -> list[tuple[int, int, int]]:
    """Four turns, each resending the conversation so far; per turn (replica port, prompt tokens, cached)."""
    messages = [{"role": "system", "content": f"Conversation {name}. {SYSTEM}"}]  # its own from the first block
    turns = []
    for number, question in enumerate(QUESTIONS):
        messages.append({"role": "user", "content": question})
        request_id = f"{name}-{number}-{uuid.uuid4().hex[:8]}"
        headers = {"X-Request-Id": request_id, **session.get("headers", {})}
        extra = {"prompt_cache_key": session["prompt_cache_key"]} if "prompt_cache_key" in session else {}
        reply = lb.client.chat.completions.create(messages=messages, extra_headers=headers, extra_body=extra, **TURN)
        messages.append({"role": "assistant", "content": reply.choices[0].message.content})
        details = reply.usage.prompt_tokens_details
        turns.append((lb.served_by(request_id), reply.usage.prompt_tokens, details.cached_tokens if details else 0))
    return turns


def test_each_conversations_turns_land_on_one_replica_whose_cache_serves_them(balancer):
    conversations = {
        "cache-key-a": {"prompt_cache_key": "conversation-a"},
        "cache-key-b": {"prompt_cache_key": "conversation-b"},
        "cache-key-c": {"prompt_cache_key": "conversation-c"},
        "header": {"headers": {"X-Session-Id": "conversation-d"}},
    }
    results = {name: chat_conversation(balancer, name, **session) for name, session in conversations.items()}
    for name, turns in results.items():
        print(f"\n{name}: " + "; ".join(f"turn {i + 1} on :{p}, {c}/{t} cached" for i, (p, t, c) in enumerate(turns)))
        assert len({port for port, _, _ in turns}) == 1, f"{name}'s turns went to several replicas: {turns}"
        previous_prompt = turns[0][1]
        for _, prompt, cached in turns[1:]:
            # the earlier turns' tokens came from the cache, up to the last whole block before the new ones
            assert cached >= previous_prompt - 16, f"{name}: {cached} of {prompt} cached after a {previous_prompt}"
            previous_prompt = prompt


def test_sessions_spread_over_the_replicas_and_requests_without_a_key_are_balanced(balancer):
    ports = set()
    for number in range(16):  # with two replicas, 16 keys all on one would be a 1 in 32,768 chance
        request_id = f"spread-{number}-{uuid.uuid4().hex[:8]}"
        balancer.client.chat.completions.create(messages=[{"role": "user", "content": "Hello"}], max_tokens=1,
                                                model=MODEL, temperature=0, prompt_cache_key=f"user-{number}",
                                                extra_headers={"X-Request-Id": request_id})  # fmt: skip
        ports.add(balancer.served_by(request_id))
    assert ports == set(balancer.ports)
    keyless = set()
    for number in range(4):  # one at a time: the fewest open connections is a tie nginx breaks in turn
        request_id = f"keyless-{number}-{uuid.uuid4().hex[:8]}"
        balancer.client.completions.create(prompt="Hello", max_tokens=1, model=MODEL, temperature=0,
                                           extra_headers={"X-Request-Id": request_id})  # fmt: skip
        keyless.add(balancer.served_by(request_id))
    assert keyless == set(balancer.ports)


@pytest.mark.skipif(not POSTGRES_URL, reason=SKIP_REASON)
def test_a_responses_conversation_stays_on_one_replica_from_its_second_turn(balancer):
    """Turn 1 has no key (balanced); every later turn names the previous response, whose id carries the
    conversation's tag: turns 2 to 4 reach one replica, and its cache holds turn 2's conversation."""
    previous, turns = None, []
    for number, question in enumerate(QUESTIONS):
        request_id = f"responses-{number}-{uuid.uuid4().hex[:8]}"
        response = balancer.client.responses.create(
            model=MODEL, input=question, instructions=SYSTEM, previous_response_id=previous, max_output_tokens=8,
            temperature=0, extra_headers={"X-Request-Id": request_id},
        )  # fmt: skip
        turns.append((balancer.served_by(request_id), response.usage.input_tokens,
                      response.usage.input_tokens_details.cached_tokens))  # fmt: skip
        if previous is not None:
            assert response.id[:21] == previous[:21] and response.id != previous  # resp_ + the same 16-digit tag
        previous = response.id
    print("\nresponses: " + "; ".join(f"turn {i + 1} on :{p}, {c}/{t} cached" for i, (p, t, c) in enumerate(turns)))
    assert len({port for port, _, _ in turns[1:]}) == 1, turns
    for (_, previous_prompt, _), (_, _, cached) in zip(turns[1:], turns[2:], strict=False):
        assert cached >= previous_prompt - 16, turns
