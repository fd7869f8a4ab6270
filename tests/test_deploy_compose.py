"""docker-compose deployment: the compose file, nginx, Prometheus and Grafana configs are valid, and
every ``decoda_*`` series the Grafana dashboard queries is one a running server exposes."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from decoding import GenerationParams, RequestOutput
from decoding.telemetry import EngineObserver
from server.app import create_app
from server.config.settings import Settings
from tests.fake_engine import FakeEngineClient

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yml"
NGINX = ROOT / "deploy" / "nginx.conf"
PROMETHEUS = ROOT / "deploy" / "prometheus.yml"
GRAFANA = ROOT / "deploy" / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "decoda.json"
REPLICAS = ["decoda-1", "decoda-2", "decoda-3"]


def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())  # PyYAML resolves the x-decoda anchor and `<<` merges


def seconds(duration: str) -> float:
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", duration)
    assert parts and "".join(n + u for n, u in parts) == duration, duration
    return sum(float(n) * units[u] for n, u in parts)


def bind_mounts(service: dict) -> dict[str, str]:
    """container path -> host path of a service's ``./host:/container[:ro]`` volumes."""
    mounts = {}
    for volume in service.get("volumes", []):
        host, container = volume.split(":")[:2]
        if host.startswith("."):
            mounts[container] = host
    return mounts


# ---- compose ----------------------------------------------------------------------------------------
def check_compose_schema(path: Path) -> subprocess.CompletedProcess:
    # check-jsonschema vendors the Compose Specification's schema (compose-spec.json): no network
    argv = [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec", str(path)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


def test_compose_file_validates_against_the_compose_spec_schema(tmp_path: Path):
    pytest.importorskip("check_jsonschema", reason="pip install -e '.[test]' installs check-jsonschema")
    result = check_compose_schema(COMPOSE)
    assert result.returncode == 0, result.stdout + result.stderr
    # the check has teeth: a misspelt service key fails it
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(COMPOSE.read_text().replace("stop_grace_period:", "stop_grace_periods:", 1))
    assert check_compose_schema(broken).returncode != 0


def test_compose_runs_three_drained_replicas_behind_nginx_with_prometheus_and_grafana():
    services = compose()["services"]
    assert {*REPLICAS, "lb", "prometheus", "grafana"} <= set(services)
    for name in REPLICAS:
        replica = services[name]
        assert replica["build"] == "."
        # the server drains 30 s, then uvicorn waits 5 s more: compose must not SIGKILL before that
        assert replica["environment"]["DECODA_DRAIN_TIMEOUT"] == "30"
        assert seconds(replica["stop_grace_period"]) >= 45
        assert "/ready" in " ".join(replica["healthcheck"]["test"])
    assert set(services["lb"]["depends_on"]) == set(REPLICAS)
    # nginx_session.js beside nginx.conf: js_import finds it relative to the config's folder
    assert bind_mounts(services["lb"]) == {"/etc/nginx/nginx.conf": "./deploy/nginx.conf",
                                           "/etc/nginx/nginx_session.js": "./deploy/nginx_session.js"}  # fmt: skip
    assert bind_mounts(services["prometheus"])["/etc/prometheus/prometheus.yml"] == "./deploy/prometheus.yml"
    grafana = bind_mounts(services["grafana"])
    assert grafana["/etc/grafana/provisioning"] == "./deploy/grafana/provisioning"
    for service in services.values():
        for host in bind_mounts(service).values():
            assert (ROOT / host).exists(), host


def test_prometheus_scrapes_every_replica_directly():
    config = yaml.safe_load(PROMETHEUS.read_text())
    decoda = next(job for job in config["scrape_configs"] if job["job_name"] == "decoda")
    targets = [t for group in decoda["static_configs"] for t in group["targets"]]
    assert (
        sorted(targets)
        == [f"{name}:8000" for name in REPLICAS]
        == sorted(f"{name}:8000" for name in compose()["services"] if name.startswith("decoda-"))
    )
    assert decoda.get("metrics_path", "/metrics") == "/metrics"


def interpolated(value: str, environ: dict[str, str] | None = None) -> str:
    """A compose value with ``${NAME:-default}`` / ``${NAME}`` resolved as compose does (from ``environ``)."""
    environ = environ or {}
    return re.sub(r"\$\{(\w+)(?::-([^}]*))?\}", lambda m: environ.get(m[1]) or m[2] or "", value)


def test_every_replica_stores_responses_in_the_one_postgresql_service():
    services = compose()["services"]
    postgres = services["postgres"]
    assert postgres["image"].startswith("postgres:")
    assert any(v.endswith(":/var/lib/postgresql/data") for v in postgres["volumes"])  # survives a restart
    assert "pg_isready" in postgres["healthcheck"]["test"]
    for environ in ({}, {"POSTGRES_PASSWORD": "s3cret"}):  # the default password and one from the shell
        database = {k: interpolated(v, environ) for k, v in postgres["environment"].items()}
        urls = {interpolated(services[name]["environment"]["DECODA_RESPONSES_STORE"], environ) for name in REPLICAS}
        assert urls == {f"postgresql://{database['POSTGRES_USER']}:{database['POSTGRES_PASSWORD']}@postgres:5432/"
                        f"{database['POSTGRES_DB']}"}  # fmt: skip
        Settings(responses_store=urls.pop()).check()  # the URL the replicas start with passes the start-up check
    for name in REPLICAS:  # a replica's first store query finds the database up
        assert services[name]["depends_on"]["postgres"] == {"condition": "service_healthy"}


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (Debian package prometheus)")
def test_promtool_check_config():
    result = subprocess.run(["promtool", "check", "config", str(PROMETHEUS)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


# ---- nginx ------------------------------------------------------------------------------------------
def test_nginx_balances_by_least_connections_and_streams_sse_unbuffered():
    conf = re.sub(r"#.*", "", NGINX.read_text())
    upstream = re.search(r"upstream decoda \{(.*?)\}", conf, re.S).group(1)
    assert "least_conn;" in upstream and re.search(r"keepalive \d+;", upstream)
    assert re.findall(r"server (\S+)", upstream)[:3] == [f"{name}:8000" for name in REPLICAS]
    server = re.search(r"server \{(.*)\}", conf, re.S).group(1)  # proxy settings every location inherits
    location = re.search(r"location @balanced \{(.*?)\}", conf, re.S).group(1)
    assert "proxy_pass http://decoda;" in location
    assert "proxy_http_version 1.1;" in server and 'proxy_set_header Connection "";' in server
    assert "proxy_buffering off;" in server
    read_timeout = re.search(r"proxy_read_timeout (\S+);", server).group(1)
    assert seconds(read_timeout) >= 600


def test_nginx_routes_a_session_to_one_replica_by_a_consistent_hash():
    """Sticky routing: location / hands each request to nginx_session.js, which routes one with a session
    key to an upstream hashing that key over the same replicas (tests/test_lb_sticky.py runs it)."""
    conf = re.sub(r"#.*", "", NGINX.read_text())
    assert re.search(r"^load_module \S*ngx_http_js_module\.so;", conf, re.M)
    assert "js_import session from nginx_session.js;" in conf and "js_var $decoda_session;" in conf
    assert re.search(r"location / \{\s*js_content session\.route;\s*\}", conf)
    sticky = re.search(r"upstream decoda_sticky \{(.*?)\}", conf, re.S).group(1)
    assert "hash $decoda_session consistent;" in sticky
    balanced = re.search(r"upstream decoda \{(.*?)\}", conf, re.S).group(1)
    assert re.findall(r"server (\S+)", sticky) == re.findall(r"server (\S+)", balanced)  # the same replicas
    assert "proxy_pass http://decoda_sticky;" in re.search(r"location @sticky \{(.*?)\}", conf, re.S).group(1)
    session_js = (ROOT / "deploy" / "nginx_session.js").read_text()
    for name in ("X-Session-Id", "prompt_cache_key", "previous_response_id", "'@sticky'", "'@balanced'"):
        assert name in session_js, name
    # the body stays in memory up to the largest body nginx accepts, where the script reads it
    assert re.search(r"client_body_buffer_size (\S+);", conf).group(1) == re.search(
        r"client_max_body_size (\S+);", conf).group(1)  # fmt: skip


@pytest.mark.skipif(
    shutil.which("nginx") is None or not Path("/usr/lib/nginx/modules/ngx_http_js_module.so").exists(),
    reason="nginx or njs not installed (Debian packages nginx, libnginx-mod-http-js)",
)
def test_nginx_config_test_passes(tmp_path: Path):
    # `nginx -t` resolves upstream host names, and the compose service names resolve only inside the
    # compose network: test the same file with the replicas pointed at 127.0.0.1
    conf = tmp_path / "nginx.conf"
    conf.write_text(re.sub(r"\bdecoda-\d+:8000\b", "127.0.0.1:8000", NGINX.read_text()))
    shutil.copy(ROOT / "deploy" / "nginx_session.js", tmp_path)  # beside the config, as compose mounts it
    # -g pid: the default /run/nginx.pid is root's; -e: the startup error log before the config's
    argv = ["nginx", "-t", "-p", str(tmp_path), "-c", str(conf), "-e", "stderr", "-g", f"pid {tmp_path}/nginx.pid;"]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr  # needs njs: Debian's libnginx-mod-http-js (.ci/run installs it)
    assert "test is successful" in result.stderr


# ---- grafana ----------------------------------------------------------------------------------------
def container_to_host(container_path: str) -> Path:
    """Where a path inside the Grafana container lives in this checkout, by compose's bind mounts."""
    for container, host in bind_mounts(compose()["services"]["grafana"]).items():
        if container_path == container or container_path.startswith(container + "/"):
            return ROOT / host / container_path[len(container) :].lstrip("/")
    raise AssertionError(f"{container_path} is not mounted into the grafana container")


def test_grafana_provisioning_points_at_prometheus_and_the_dashboard_folder():
    provisioning = GRAFANA / "provisioning"
    datasource_files = sorted((provisioning / "datasources").glob("*.yml"))
    dashboard_files = sorted((provisioning / "dashboards").glob("*.yml"))
    assert datasource_files and dashboard_files
    datasources = [d for f in datasource_files for d in yaml.safe_load(f.read_text())["datasources"]]
    prometheus = next(d for d in datasources if d["type"] == "prometheus")
    assert prometheus["url"] == "http://prometheus:9090" and "prometheus" in compose()["services"]
    for f in dashboard_files:
        config = yaml.safe_load(f.read_text())
        assert config["apiVersion"] == 1
        for provider in config["providers"]:
            assert provider["type"] == "file"
            folder = container_to_host(provider["options"]["path"])
            assert folder.is_dir() and (folder / DASHBOARD.name).is_file(), folder
    home = compose()["services"]["grafana"]["environment"].get("GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH")
    if home:
        assert container_to_host(home) == DASHBOARD


def dashboard_panels() -> list[dict]:
    dashboard = json.loads(DASHBOARD.read_text())
    panels = []
    for panel in dashboard["panels"]:
        panels += panel.get("panels", []) if panel["type"] == "row" else [panel]
    return panels


def test_dashboard_panels_each_have_a_datasource_and_a_query():
    dashboard = json.loads(DASHBOARD.read_text())
    uids = {
        d["uid"]
        for f in (GRAFANA / "provisioning" / "datasources").glob("*.yml")
        for d in yaml.safe_load(f.read_text())["datasources"]
    }
    assert dashboard["uid"] and dashboard["title"]
    panels = dashboard_panels()
    assert len({p["id"] for p in panels}) == len(panels)
    for panel in panels:
        assert panel["datasource"]["uid"] in uids, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["expr"].strip() and target["datasource"]["uid"] in uids, panel["title"]
    titles = " | ".join(p["title"] for p in panels).lower()
    for wanted in ["time to first token", "inter-token", "tokens/s", "running and waiting", "kv cache",
                   "speculative acceptance", "errors", "by priority", "by caller"]:  # fmt: skip
        assert wanted in titles, wanted


def test_the_priority_and_caller_panels_show_each_level_and_caller_apart():
    """Per-priority and per-caller latency: quantiles kept apart by the label (never summed over it)."""
    for label in ("priority", "caller"):
        panels = [p for p in dashboard_panels() if p["title"].lower().endswith(f"by {label}")]
        assert {p["title"].split(" by ")[0] for p in panels} == {"Time to first token", "End-to-end latency"}
        for panel in panels:
            for target in panel["targets"]:
                assert f"sum by (le, {label})" in target["expr"] and f"_by_{label}_seconds_bucket" in target["expr"]
                assert f"{{{{{label}}}}}" in target["legendFormat"]


def dashboard_metric_names() -> set[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    queries = [t["expr"] for p in dashboard_panels() for t in p["targets"]]
    queries += [v["definition"] for v in dashboard.get("templating", {}).get("list", []) if "definition" in v]
    return {name for query in queries for name in re.findall(r"\b(decoda_[a-zA-Z0-9_:]+)", query)}


class ObservedFakeEngine(FakeEngineClient):
    """The fake engine, reporting each request to the app's metrics the way the real engine's worker
    does (admitted, first token, tokens, step, speculation, finished)."""

    observer: EngineObserver

    async def _run(
        self, request_id: str, prompt_ids: list[int], params: GenerationParams
    ) -> AsyncIterator[RequestOutput]:
        self.observer.on_admitted("greedy", 0.001, len(prompt_ids))
        first = True
        async for output in super()._run(request_id, prompt_ids, params):
            if first:
                self.observer.on_first_token("greedy", 0.01)
                first = False
            self.observer.on_tokens("greedy", 1, [0.02])
            self.observer.on_step(1, 1, 0, 1 / 8)
            self.observer.on_speculation("prompt_lookup", 4, 3)
            if output.finished:  # the server may stop iterating at the finished output
                self.observer.on_finished("greedy", "length", 0.05)
            yield output


def test_every_series_the_dashboard_queries_is_exposed_by_the_server():
    engine = ObservedFakeEngine()
    app = create_app(Settings(), engine_client=engine)
    engine.observer = app.state.metrics

    async def scrape() -> str:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            body = {"model": engine.model_name, "prompt": "hello world", "max_tokens": 3}
            assert (await http.post("/v1/completions", json=body)).status_code == 200
            return (await http.get("/metrics")).text

    exposition = asyncio.run(scrape())
    samples = {s.name for family in text_string_to_metric_families(exposition) for s in family.samples}
    wanted = dashboard_metric_names()
    assert {"decoda_time_to_first_token_seconds_bucket", "decoda_generation_tokens_total",
            "decoda_time_to_first_token_by_priority_seconds_bucket",
            "decoda_e2e_request_latency_by_caller_seconds_bucket"} <= wanted  # fmt: skip
    assert not wanted - samples, f"the dashboard queries series /metrics does not expose: {sorted(wanted - samples)}"
    # histogram series are queried by their _bucket/_sum/_count series, never by the bare family name
    families = {f.name for f in text_string_to_metric_families(exposition) if f.type == "histogram"}
    assert not wanted & families, sorted(wanted & families)
