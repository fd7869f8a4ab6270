"""deploy/nginx.conf's session key (``deploy/nginx_session.js``), run by real nginx in front of two stub replicas.

No model here: each stub answers with its own port, so what is checked is nginx's choice alone, for every
way a request can name its session: the ``X-Session-Id`` header, the body's ``prompt_cache_key``, the
conversation tag of ``previous_response_id`` (``server/api/responses/ids.py``), in that order, and no
key at all (a body that is not JSON, an id of another shape). tests/test_lb_sticky.py runs the same
config in front of real replicas.
"""

from __future__ import annotations

import json
import secrets
import signal
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from server.api.responses.ids import conversation_tag, response_id
from tests.test_e2e_openai import free_port
from tests.test_lb_nginx_drain import NGINX, nginx_conf, wait_ready

pytestmark = pytest.mark.skipif(NGINX is None, reason="nginx with njs is not installed (Debian packages nginx and "
                                "libnginx-mod-http-js; .ci/run installs them)")  # fmt: skip


class Stub(BaseHTTPRequestHandler):
    """Answers every request with the port it listens on and the body's length it received."""

    def _answer(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        out = json.dumps({"port": self.server.server_address[1], "received": len(body)}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    do_GET = do_POST = _answer  # noqa: N815

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def lb(tmp_path_factory) -> Iterator[tuple[httpx.Client, list[int]]]:
    stubs = [ThreadingHTTPServer(("127.0.0.1", 0), Stub) for _ in range(2)]
    for stub in stubs:
        threading.Thread(target=stub.serve_forever, daemon=True).start()
    ports = [stub.server_address[1] for stub in stubs]
    folder: Path = tmp_path_factory.mktemp("nginx-session")
    listen = free_port()
    conf = nginx_conf(folder, listen, ports)
    nginx = subprocess.Popen([NGINX, "-p", str(folder), "-c", str(conf), "-g", "daemon off;"])
    url = f"http://127.0.0.1:{listen}"
    try:
        wait_ready(url)
        with httpx.Client(base_url=url, timeout=10) as client:
            yield client, ports
    finally:
        nginx.send_signal(signal.SIGQUIT)
        nginx.wait(10)
        for stub in stubs:
            stub.shutdown()


def port_for(url: httpx.Client, body: object = None, headers: dict | None = None, raw: bytes | None = None) -> int:
    """The stub nginx sent this request to (``url``: a client of nginx)."""
    content = raw if raw is not None else json.dumps(body).encode()
    response = url.post("/v1/chat/completions", content=content, headers=headers or {})
    assert response.status_code == 200, response.text
    assert response.json()["received"] == len(content)  # the body reached the replica whole
    return response.json()["port"]


def test_one_key_one_replica_and_keys_spread(lb):
    url, ports = lb
    for key in ("conversation-1", "conversation-2", "user-42"):
        assert len({port_for(url, {"prompt_cache_key": key, "messages": [], "n": i}) for i in range(6)}) == 1
    spread = {port_for(url, {"prompt_cache_key": f"user-{i}"}) for i in range(24)}
    assert spread == set(ports)  # 24 keys on one of two replicas: a 1 in 8 million chance


def test_the_header_comes_first_then_the_cache_key_then_the_conversation_tag(lb):
    url, ports = lb
    by_header = {port_for(url, {"prompt_cache_key": f"user-{i}"}, {"X-Session-Id": "session-7"}) for i in range(12)}
    assert len(by_header) == 1  # twelve cache keys, one header: the header decides
    first = response_id()
    chain = [first]
    for _ in range(5):
        chain.append(response_id(chain[-1]))
    assert len(set(chain)) == 6 and {conversation_tag(r) for r in chain} == {conversation_tag(first)}
    assert len({port_for(url, {"previous_response_id": r, "input": "next"}) for r in chain}) == 1
    # one conversation tag, 24 cache keys: the cache key decides, so they spread
    with_key = {port_for(url, {"previous_response_id": first, "prompt_cache_key": f"k-{i}"}) for i in range(24)}
    assert with_key == set(ports)
    tags = {port_for(url, {"previous_response_id": response_id(), "input": "x"}) for _ in range(24)}
    assert tags == set(ports)  # different conversations spread


def test_no_key_is_balanced_by_connections(lb):
    url, ports = lb
    keyless = [
        {"messages": [{"role": "user", "content": "hi"}]},
        {"previous_response_id": "resp_not-ours"},  # an id of another shape names no conversation
        {"prompt_cache_key": ""},
    ]
    for body in keyless:
        assert {port_for(url, body) for _ in range(4)} == set(ports), body  # one at a time: in turn
    assert {port_for(url, raw=b"not json {") for _ in range(4)} == set(ports)
    assert {port_for(url, raw=b"") for _ in range(4)} == set(ports)


def test_a_large_body_keeps_its_key(lb):
    url, _ = lb
    big = "x" * 3_000_000  # past the default 8/16 KiB body buffer: the config keeps bodies in memory
    ports = {port_for(url, {"prompt_cache_key": "long-conversation", "messages": [{"content": big}], "n": i})
             for i in range(3)}  # fmt: skip
    assert ports == {port_for(url, {"prompt_cache_key": "long-conversation"})}


def test_response_ids_keep_the_conversations_tag_and_stay_unguessable():
    first = response_id()
    assert first.startswith("resp_") and len(first) == 37 and int(first[5:], 16) >= 0
    later = [response_id(first) for _ in range(200)]
    assert {r[:21] for r in later} == {first[:21]} and len(set(later)) == 200
    assert len({r[21:] for r in later}) == 200  # 64 random bits each
    for foreign in (None, "", "resp_123", "resp_" + "g" * 32, "msg_" + secrets.token_hex(16), first.upper()):
        fresh = response_id(foreign)
        assert fresh.startswith("resp_") and conversation_tag(fresh) != conversation_tag(first)
