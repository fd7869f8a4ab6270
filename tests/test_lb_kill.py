"""Two real replicas on one PostgreSQL behind real nginx (``deploy/nginx.conf``), one killed with SIGKILL.

A crash gives no drain: what an operator relies on is that nothing looks finished that was not.
- A stream the killed replica was writing ends as an error the client sees (nginx forwards the
  replica's chunks and, when the replica's connection drops, closes the client's without the last
  chunk: the ``openai`` client raises), never an end of stream that reads as a complete answer.
- Requests sent after the kill (nginx has not yet marked the replica down: its connection is
  refused) are retried on the replica that stayed (``proxy_next_upstream error``): all answered.
- A background response the killed replica was running is stored as ``failed`` once its heartbeat
  is a lease old (``--responses-lease``), read from the other replica, and the same request sent
  again there completes.
Needs ``DECODA_TEST_POSTGRES_URL`` (``.ci/run`` starts a cluster) and nginx.
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time

import httpx
import openai
import pytest
from openai import OpenAI

from tests.postgres import POSTGRES_URL, SKIP_REASON, fresh_schema
from tests.test_e2e_openai import MODEL, free_port, stop_server
from tests.test_lb_nginx_drain import NGINX, nginx_conf, wait_ready
from tests.test_lb_responses import start_replicas

pytestmark = [
    pytest.mark.slow,
    pytest.mark.e2e,
    pytest.mark.skipif(not POSTGRES_URL, reason=SKIP_REASON),
    pytest.mark.skipif(NGINX is None, reason="nginx is not installed (Debian package nginx; .ci/run installs it)"),
]

LEASE = 4.0
LONG = {"max_tokens": 400, "temperature": 0, "extra_body": {"ignore_eos": True}}


def running(base: str) -> float:
    """Requests a replica is generating now, from its own /metrics."""
    text = httpx.get(f"{base}/metrics", timeout=5).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("decoda_num_requests_running"))  # fmt: skip


def wait_for(predicate, seconds: float, what: str) -> None:  # noqa: ANN001
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, f"{what} not seen in {seconds} s"
        time.sleep(0.2)


def test_sigkill_of_a_replica_cuts_its_stream_visibly_and_loses_no_later_request(smollm2, tmp_path):
    with fresh_schema() as store:
        replicas = start_replicas("--max-model-len", "512", "--num-threads", "1", "--responses-store", store,
                                  "--responses-lease", str(LEASE))  # fmt: skip
        listen = free_port()
        conf = nginx_conf(tmp_path, listen, [int(base.rsplit(":", 1)[1]) for base, _ in replicas])
        nginx = subprocess.Popen([NGINX, "-p", str(tmp_path), "-c", str(conf), "-g", "daemon off;"])
        url = f"http://127.0.0.1:{listen}"
        lb = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300)
        outcome: dict[str, object] = {}
        try:
            wait_ready(url)

            def stream_through_nginx() -> None:
                chunks, finish = 0, None
                try:
                    for chunk in lb.completions.create(model=MODEL, prompt="Tell me a long story.", stream=True,
                                                       **LONG):  # fmt: skip
                        chunks += 1
                        outcome["chunks"] = chunks
                        finish = chunk.choices[0].finish_reason if chunk.choices else finish
                    outcome["ended"] = ("complete", finish, chunks)
                except (openai.APIError, httpx.HTTPError) as error:
                    outcome["ended"] = ("error", type(error).__name__, chunks)

            reader = threading.Thread(target=stream_through_nginx)
            reader.start()
            wait_for(lambda: outcome.get("chunks", 0) >= 3, 120, "the stream's first chunks")
            (victim, victim_proc), (survivor, survivor_proc) = sorted(replicas, key=lambda r: -running(r[0]))
            assert running(victim) == 1 and running(survivor) == 0

            # a background response on the victim too, running when the replica dies
            direct = OpenAI(base_url=f"{victim}/v1", api_key="unused", max_retries=0, timeout=60)
            background = direct.responses.create(model=MODEL, input="Count to one thousand.", background=True,
                                                 max_output_tokens=400, temperature=0)  # fmt: skip
            wait_for(lambda: direct.responses.retrieve(background.id).status == "in_progress", 60, "in_progress")

            victim_proc.send_signal(signal.SIGKILL)
            victim_proc.wait(30)
            reader.join(60)
            assert not reader.is_alive()

            # requests after the kill: nginx retries the refused connection on the survivor
            after = [lb.completions.create(model=MODEL, prompt=f"Say {i}.", max_tokens=4, temperature=0,
                                        extra_body={"ignore_eos": True})
                     for i in range(6)]  # fmt: skip

            # the background run is failed once its heartbeat is a lease old, read on the survivor
            other = OpenAI(base_url=f"{survivor}/v1", api_key="unused", max_retries=0, timeout=300)
            wait_for(lambda: other.responses.retrieve(background.id).status == "failed", 4 * LEASE + 30,
                     "the background response failed")  # fmt: skip
            failed = other.responses.retrieve(background.id)
            retried = other.responses.create(model=MODEL, input="Count to one thousand.", background=True,
                                             max_output_tokens=8, temperature=0)  # fmt: skip
            wait_for(lambda: other.responses.retrieve(retried.id).status not in ("queued", "in_progress"), 120,
                     "the retried response finished")  # fmt: skip
            retried = other.responses.retrieve(retried.id)
        finally:
            nginx.send_signal(signal.SIGQUIT)
            nginx.wait(10)
            for _, proc in replicas:
                stop_server(proc)
    kind, detail, chunks = outcome["ended"]
    print(f"\nthe killed replica's stream ended as {kind} ({detail}) after {chunks} chunks; "
          f"{len(after)} requests after the kill all answered; background run: {failed.status} "
          f"({failed.error.message if failed.error else ''}), retried: {retried.status}")
    assert kind == "error", f"the cut stream looked complete: finish_reason {detail} after {chunks} chunks"
    assert all(c.choices[0].text is not None and c.usage.completion_tokens == 4 for c in after)
    assert failed.status == "failed" and failed.error is not None and "stopped" in failed.error.message
    # the retry ran to its end (max_output_tokens: "incomplete", by design)
    assert retried.status == "incomplete" and retried.incomplete_details.reason == "max_output_tokens"
    assert retried.output_text
