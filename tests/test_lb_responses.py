"""Two real replicas on one PostgreSQL, behind real nginx (``deploy/nginx.conf``): a Responses API
conversation started on one replica continues on the other.

What an operator of several replicas relies on: ``previous_response_id`` works whichever replica the
load balancer picks, because the stored responses live in the shared database
(``--responses-store postgresql://...``), not in a replica. Replica A answers the first turn; B
retrieves it and answers the second, whose prompt holds A's turn (its input tokens grow by the whole
first turn, against the same question asked alone); a third turn goes through nginx to whichever
replica it picks. Needs ``DECODA_TEST_POSTGRES_URL`` (``.ci/run`` starts a cluster) and nginx.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest
from openai import OpenAI

from tests.postgres import POSTGRES_URL, SKIP_REASON, execute, fresh_schema
from tests.test_e2e_openai import MODEL, free_port, start_server, stop_server
from tests.test_lb_nginx_drain import NGINX, nginx_conf, wait_ready

pytestmark = [
    pytest.mark.slow,
    pytest.mark.e2e,
    pytest.mark.skipif(not POSTGRES_URL, reason=SKIP_REASON),
    pytest.mark.skipif(NGINX is None, reason="nginx is not installed (Debian package nginx; .ci/run installs it)"),
]

TURN = {"model": MODEL, "max_output_tokens": 16, "temperature": 0}


def start_replicas(*flags: str) -> list[tuple[str, subprocess.Popen]]:
    """Two ``decoda serve`` processes, loading at once; none left running if one fails to start."""
    with ThreadPoolExecutor(2) as pool:
        starting = [pool.submit(start_server, *flags) for _ in range(2)]
    started = [future.result() for future in starting if future.exception() is None]
    failures = [future.exception() for future in starting if future.exception() is not None]
    if failures:
        for _, proc in started:
            stop_server(proc)
        raise failures[0]
    return started


def test_a_conversation_started_on_one_replica_continues_on_the_other_and_through_nginx(smollm2, tmp_path):
    with fresh_schema() as store:
        # one torch thread each: two replicas on two cores
        replicas = start_replicas("--max-model-len", "512", "--num-threads", "1", "--responses-store", store)
        (base_a, proc_a), (base_b, proc_b) = replicas
        listen = free_port()
        conf = nginx_conf(tmp_path, listen, [int(base.rsplit(":", 1)[1]) for base, _ in replicas])
        nginx = subprocess.Popen([NGINX, "-p", str(tmp_path), "-c", str(conf), "-g", "daemon off;"])
        a, b, lb = (OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=300)
                    for base in (base_a, base_b, f"http://127.0.0.1:{listen}"))  # fmt: skip
        try:
            wait_ready(f"http://127.0.0.1:{listen}")
            first = a.responses.create(input="My name is Ada. Say hello to me.", **TURN)
            retrieved = b.responses.retrieve(first.id)
            second = b.responses.create(input="What is my name?", previous_response_id=first.id, **TURN)
            alone = b.responses.create(input="What is my name?", store=False, **TURN)
            third = lb.responses.create(input="Spell it.", previous_response_id=second.id, **TURN)
            rows = asyncio.run(execute(store, "SELECT id FROM responses ORDER BY created_at"))
        finally:
            nginx.send_signal(signal.SIGQUIT)
            nginx.wait(10)
            for _, proc in replicas:
                stop_server(proc)
    print(f"\nturn 1 on A: {first.usage.input_tokens} prompt tokens; turn 2 on B: {second.usage.input_tokens} "
          f"(the question alone: {alone.usage.input_tokens}); turn 3 through nginx: {third.usage.input_tokens}")
    # B reads A's response from the database, and its prompt holds A's whole turn
    assert (retrieved.id, retrieved.output_text) == (first.id, first.output_text) and first.output_text
    assert second.usage.input_tokens > alone.usage.input_tokens + first.usage.output_tokens
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    # through nginx, on whichever replica: the prompt holds both earlier turns
    assert third.usage.input_tokens > second.usage.input_tokens + second.usage.output_tokens
    # one database holds what both replicas stored (store: false stored nothing)
    assert [row["id"] for row in rows] == [first.id, second.id, third.id]
