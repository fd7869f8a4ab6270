"""deploy/kubernetes/ is valid Kubernetes and says what DESIGN.md (Deployment) promises.

Every resource kustomization.yaml lists, and the ConfigMap its configMapGenerator builds, is checked
against the OpenAPI schemas kubernetes-validate ships (strict: unknown fields fail), offline and
without kubectl. Then the properties the server relies on: probe paths, a grace period longer than
the drain, non-root with a read-only root filesystem, the HPA's CPU and queue-depth metrics (a
metric server/http/metrics.py really exports), the API key only referenced, selectors that match.
"""

from __future__ import annotations

import math
import re
import shutil
import subprocess
from dataclasses import fields
from pathlib import Path

import kubernetes_validate  # the test extra: ships the Kubernetes schemas, needs no network
import pytest
import yaml

from server.cli import DRAIN_MARGIN
from server.config.settings import Settings
from server.config.sources import env_name

ROOT = Path(__file__).resolve().parent.parent
KUSTOMIZE = ROOT / "deploy" / "kubernetes"
K8S_VERSION = "1.30.0"  # the oldest Kubernetes these manifests promise to run on
QUEUE_METRIC = "decoda_num_requests_waiting"
API_KEY_SECRET = "decoda-api-keys"
POSTGRES_SECRET = "decoda-postgres"
CONFIG_MAP = "decoda-config"


def kustomization() -> dict:
    return yaml.safe_load((KUSTOMIZE / "kustomization.yaml").read_text())


def generated_configmaps() -> list[dict]:
    """What kustomize's configMapGenerator makes (without its hash suffix): ``files`` entries are
    ``KEY=PATH`` or ``PATH`` (key: the file name)."""
    maps = []
    for generator in kustomization().get("configMapGenerator", []):
        data = {}
        for entry in generator.get("files", []):
            key, sep, path = entry.partition("=")
            if not sep:
                key, path = Path(entry).name, entry
            data[key] = (KUSTOMIZE / path).read_text()
        for entry in generator.get("literals", []):
            key, _, value = entry.partition("=")
            data[key] = value
        maps.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": generator["name"]}, "data": data})
    return maps


def rendered() -> list[dict]:
    """``kustomize build`` without kustomize: the listed resources plus the generated ConfigMaps."""
    docs = []
    for name in kustomization()["resources"]:
        docs += [doc for doc in yaml.safe_load_all((KUSTOMIZE / name).read_text()) if doc]
    return docs + generated_configmaps()


def one(kind: str, name: str | None = None) -> dict:
    found = [doc for doc in rendered() if doc["kind"] == kind and name in (None, doc["metadata"]["name"])]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def container() -> dict:
    (main,) = one("Deployment")["spec"]["template"]["spec"]["containers"]
    return main


def env() -> dict[str, dict]:
    return {item["name"]: item for item in container()["env"]}


def deployment_labels() -> dict:
    return one("Deployment")["spec"]["template"]["metadata"]["labels"]


def test_the_kustomization_lists_every_manifest_in_the_folder():
    listed = set(kustomization()["resources"])
    on_disk = {path.name for path in KUSTOMIZE.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == on_disk
    assert {doc["kind"] for doc in rendered()} >= {
        "Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget", "ConfigMap"
    }  # fmt: skip
    assert not (ROOT / "deploy" / "k8s").exists(), "the old single manifest is replaced by deploy/kubernetes"


@pytest.mark.parametrize("doc", rendered(), ids=lambda doc: f"{doc['kind']}/{doc['metadata']['name']}")
def test_every_resource_validates_strictly_against_the_kubernetes_schema(doc):
    # raises ValidationError (schema violation, unknown field) or SchemaNotFoundError (unknown kind)
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_the_config_map_is_the_repository_config_and_the_server_reads_it():
    # kustomize reads nothing outside its folder, so deploy/kubernetes/config/ holds copies: keep them equal
    (config_map,) = [doc for doc in generated_configmaps() if doc["metadata"]["name"] == CONFIG_MAP]
    assert config_map["data"]["server.yaml"] == (ROOT / "config" / "server.yaml").read_text()
    presets = ROOT / "config" / "presets"
    for preset in sorted(presets.glob("*")) if presets.is_dir() else []:
        assert config_map["data"].get(preset.name) == preset.read_text(), f"add {preset} to the configMapGenerator"
    mounts = {mount["name"]: mount for mount in container()["volumeMounts"]}
    volumes = {volume["name"]: volume for volume in one("Deployment")["spec"]["template"]["spec"]["volumes"]}
    (config_volume,) = [name for name, vol in volumes.items() if vol.get("configMap", {}).get("name") == CONFIG_MAP]
    mounted = f"{mounts[config_volume]['mountPath']}/server.yaml"
    assert mounted == env()["DECODA_CONFIG"]["value"] == "/etc/decoda/server.yaml"
    assert mounts[config_volume]["readOnly"] is True


def test_the_pods_serve_the_config_maps_presets(tmp_path):
    from server.translate.presets import Presets

    (config_map,) = [doc for doc in generated_configmaps() if doc["metadata"]["name"] == CONFIG_MAP]
    for name, text in config_map["data"].items():
        (tmp_path / name).write_text(text)  # the ConfigMap as the pod sees its mount
    mounts = {mount["name"]: mount["mountPath"] for mount in container()["volumeMounts"]}
    assert env()["DECODA_PRESETS_DIR"]["value"] == mounts["config"]
    shipped = sorted(path.stem for path in (ROOT / "config" / "presets").glob("*.json"))
    assert shipped and Presets.load([tmp_path]).names() == shipped


def test_every_decoda_variable_is_a_real_setting():
    known = {env_name(f.name) for f in fields(Settings)} | {"DECODA_CONFIG"}
    assert {name for name in env() if name.startswith("DECODA_")} <= known
    assert env()["DECODA_HOST"]["value"] == "0.0.0.0"
    assert container()["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]
    assert env()["DECODA_PORT"]["value"] == "8000"


def test_probes_startup_readiness_and_liveness():
    main = container()
    assert main["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert main["livenessProbe"]["httpGet"]["path"] == "/health"  # 503 once the worker thread is dead
    startup = main["startupProbe"]
    assert startup["httpGet"]["path"] in ("/ready", "/health")
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 2 * 60  # a ~60 s first load, with margin
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert main[probe]["httpGet"]["port"] in ("http", 8000)


def drain_timeout() -> float:
    """What the pod drains for: DECODA_DRAIN_TIMEOUT in the Deployment, else the mounted server.yaml,
    else the built-in default."""
    if "DECODA_DRAIN_TIMEOUT" in env():
        return float(env()["DECODA_DRAIN_TIMEOUT"]["value"])
    config = yaml.safe_load((ROOT / "config" / "server.yaml").read_text()) or {}
    default = next(f.default for f in fields(Settings) if f.name == "drain_timeout")
    return float(config.get("drain_timeout", default))


def test_the_grace_period_covers_the_pre_stop_sleep_and_the_whole_drain():
    pre_stop = container()["lifecycle"]["preStop"]
    if "exec" in pre_stop:
        command = pre_stop["exec"]["command"]
        assert command[0] == "sleep"
        sleep = float(command[1])
    else:
        sleep = float(pre_stop["sleep"]["seconds"])
    assert sleep > 0  # the Service drops the pod before SIGTERM starts the drain
    grace = one("Deployment")["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    # the grace period counts from the delete: preStop, then the drain, then uvicorn's margin
    assert grace > sleep + math.ceil(drain_timeout()) + DRAIN_MARGIN
    assert grace >= 45


def test_the_pod_runs_as_non_root_on_a_read_only_root_filesystem():
    pod = one("Deployment")["spec"]["template"]["spec"]
    context = container()["securityContext"]
    assert context["runAsNonRoot"] is True and pod["securityContext"]["runAsNonRoot"] is True
    assert context["runAsUser"] > 0
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"]["drop"] == ["ALL"]
    assert context["readOnlyRootFilesystem"] is True
    # temporary files go to a writable emptyDir; the model cache is the image's, read only
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    mounts = {mount["mountPath"]: mount["name"] for mount in container()["volumeMounts"]}
    assert "emptyDir" in volumes[mounts["/tmp"]]
    assert "DECODA_CACHE_DIR" not in env()  # the Dockerfile's /opt/decoda/cache, converted at build time
    resources = container()["resources"]
    assert {"cpu", "memory"} <= set(resources["requests"]) and {"cpu", "memory"} <= set(resources["limits"])


def test_the_api_key_is_only_a_secret_reference():
    reference = env()["DECODA_API_KEY"]
    assert "value" not in reference
    assert reference["valueFrom"]["secretKeyRef"]["name"] == API_KEY_SECRET
    assert reference["valueFrom"]["secretKeyRef"]["optional"] is True
    assert not [doc for doc in rendered() if doc["kind"] == "Secret"]
    assert "secretGenerator" not in kustomization()
    for path in KUSTOMIZE.rglob("*"):
        if path.is_file():
            assert not re.search(r"^kind:\s*Secret\b", path.read_text(), re.MULTILINE), path


def test_the_hpa_scales_the_deployment_on_cpu_and_queue_depth():
    hpa = one("HorizontalPodAutoscaler")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "decoda"}
    assert hpa["spec"]["minReplicas"] >= 2
    by_type = {metric["type"]: metric for metric in hpa["spec"]["metrics"]}
    assert by_type["Resource"]["resource"]["name"] == "cpu"
    assert by_type["Resource"]["resource"]["target"]["type"] == "Utilization"
    assert by_type["Pods"]["pods"]["metric"]["name"] == QUEUE_METRIC
    assert by_type["Pods"]["pods"]["target"]["type"] == "AverageValue"


def test_the_queue_metric_exists_and_prometheus_adapter_serves_it():
    assert f'"{QUEUE_METRIC}"' in (ROOT / "server" / "http" / "metrics.py").read_text()
    (adapter,) = [doc for doc in rendered() if doc["kind"] == "ConfigMap" and "config.yaml" in doc.get("data", {})]
    rules = yaml.safe_load(adapter["data"]["config.yaml"])["rules"]
    (rule,) = [rule for rule in rules if rule["name"]["as"] == QUEUE_METRIC]
    assert rule["seriesQuery"].startswith(QUEUE_METRIC + "{")
    assert re.search(rule["name"]["matches"], QUEUE_METRIC)
    assert rule["resources"]["overrides"] == {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}
    assert "<<.Series>>" in rule["metricsQuery"] and "<<.LabelMatchers>>" in rule["metricsQuery"]
    assert "<<.GroupBy>>" in rule["metricsQuery"]
    annotations = one("Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true" and annotations["prometheus.io/path"] == "/metrics"


def test_the_service_and_the_pdb_select_the_deployment_pods():
    deployment = one("Deployment")
    labels = deployment_labels()
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    service = one("Service", "decoda")
    assert service["spec"]["selector"].items() <= labels.items()
    assert service["spec"]["ports"][0]["targetPort"] in ("http", 8000)
    pdb = one("PodDisruptionBudget")
    assert pdb["apiVersion"] == "policy/v1"
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    # with maxUnavailable 1 (or minAvailable below the HPA's floor) a node drain can always proceed
    assert pdb["spec"].get("maxUnavailable") == 1 or pdb["spec"]["minAvailable"] < deployment["spec"]["replicas"]


def test_strict_validation_rejects_an_unknown_field():
    """The check above is not a no-op: a misspelt field fails (the strict schemas forbid extras)."""
    deployment = yaml.safe_load((KUSTOMIZE / "deployment.yaml").read_text())
    deployment["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {"httpGet": {"path": "/ready"}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed: the rendering above stands alone")
def test_kubectl_kustomize_renders_what_these_tests_check():
    """Where kubectl is around, its own kustomize build (offline, no cluster) matches the hand-made one,
    up to the ConfigMap hash suffix it appends (and rewrites into the Deployment's volume)."""
    built = subprocess.run(
        ["kubectl", "kustomize", str(KUSTOMIZE)], capture_output=True, text=True, timeout=20, check=True
    ).stdout
    suffixed = re.compile(rf"^{CONFIG_MAP}-[a-z0-9]{{10}}$")

    def unhashed(node):
        if isinstance(node, dict):
            return {key: unhashed(value) for key, value in node.items()}
        if isinstance(node, list):
            return [unhashed(value) for value in node]
        return CONFIG_MAP if isinstance(node, str) and suffixed.match(node) else node

    key = lambda doc: (doc["kind"], doc["metadata"]["name"])  # noqa: E731
    ours = sorted(rendered(), key=key)
    theirs = sorted((unhashed(doc) for doc in yaml.safe_load_all(built) if doc), key=key)
    assert theirs == ours


# ---- the responses store ---------------------------------------------------------------------------
def test_every_pod_stores_responses_in_the_one_postgresql_the_manifests_run():
    """DECODA_RESPONSES_STORE names the PostgreSQL Service and the StatefulSet's user and database; its
    password is the Secret's, expanded by Kubernetes from a variable defined before it (``$(NAME)``)."""
    names = [item["name"] for item in container()["env"]]
    url = env()["DECODA_RESPONSES_STORE"]["value"]
    match = re.fullmatch(r"postgresql://(\w+):\$\((\w+)\)@([\w-]+):(\d+)/(\w+)", url)
    assert match, url
    user, password_variable, host, port, database = match.groups()
    assert names.index(password_variable) < names.index("DECODA_RESPONSES_STORE")
    reference = env()[password_variable]["valueFrom"]["secretKeyRef"]
    assert "value" not in env()[password_variable] and reference == {"name": POSTGRES_SECRET, "key": "password"}
    Settings(responses_store=url.replace(f"$({password_variable})", "s3cret")).check()

    service = one("Service", host)
    assert int(port) in [p["port"] for p in service["spec"]["ports"]]
    postgres = one("StatefulSet", host)
    pod = postgres["spec"]["template"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert not service["spec"]["selector"].items() <= deployment_labels().items()  # never the Decoda pods
    for selecting in (one("Service", "decoda"), one("PodDisruptionBudget")):  # Decoda's own select no database
        selector = selecting["spec"].get("selector", {})
        assert not dict(selector.get("matchLabels", selector)).items() <= pod["metadata"]["labels"].items()
    (database_container,) = pod["spec"]["containers"]
    database_env = {item["name"]: item for item in database_container["env"]}
    assert database_env["POSTGRES_USER"]["value"] == user and database_env["POSTGRES_DB"]["value"] == database
    assert database_env["POSTGRES_PASSWORD"]["valueFrom"]["secretKeyRef"] == reference
    assert int(port) in [p["containerPort"] for p in database_container["ports"]]


def test_the_database_keeps_its_files_on_a_volume_as_a_non_root_user():
    postgres = one("StatefulSet", "decoda-postgres")
    pod = postgres["spec"]["template"]["spec"]
    (database,) = pod["containers"]
    assert postgres["spec"]["replicas"] == 1 and postgres["spec"]["serviceName"] == "decoda-postgres"
    claims = {claim["metadata"]["name"] for claim in postgres["spec"]["volumeClaimTemplates"]}
    mounts = {mount["mountPath"]: mount["name"] for mount in database["volumeMounts"]}
    pgdata = {item["name"]: item.get("value") for item in database["env"]}["PGDATA"]
    data_mount = next(path for path in mounts if pgdata.startswith(path + "/"))  # a folder in it: not lost+found
    assert mounts[data_mount] in claims
    context = database["securityContext"]
    assert context["runAsNonRoot"] is True and context["runAsUser"] > 0 and pod["securityContext"]["fsGroup"] > 0
    assert context["readOnlyRootFilesystem"] is True and context["allowPrivilegeEscalation"] is False
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    for writable in ("/var/run/postgresql", "/tmp"):  # the socket and lock files; temporary files
        assert "emptyDir" in volumes[mounts[writable]]
    assert "pg_isready" in database["readinessProbe"]["exec"]["command"]
