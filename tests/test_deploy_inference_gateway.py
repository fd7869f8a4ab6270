"""deploy/kubernetes/inference-gateway/: the Decoda pods as an InferencePool behind the inference extension's
endpoint picker, valid against the CRDs' schemas and wired to what the server really serves.

Kubernetes' own kinds (the EPP's Deployment, Service, ConfigMap, ServiceAccount, Role, RoleBinding) are
checked strictly against kubernetes-validate's schemas, as tests/test_deploy_kubernetes.py checks the base;
the custom ones (InferencePool, InferenceObjective, HTTPRoute) against the upstream CRDs' openAPIV3Schema
(tests/crd_schemas.py, with the versions they come from) and their CEL rules. Then the wiring: the pool
selects the Decoda pods on their port, names the EPP's Service and port; the EPP names the pool, mounts
its config, may read what it reads; the route sends to the pool; the pods serve the vLLM series the
EPP's vllm engine config reads (``--metrics-compat vllm``), which tests/test_metrics_vllm.py checks.
"""

from __future__ import annotations

from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from server.config.settings import Settings
from server.http.metrics_vllm import CACHE_INFO, GAUGES, LORA_INFO
from tests.crd_schemas import SCHEMAS, cel_errors
from tests.test_deploy_kubernetes import K8S_VERSION, KUSTOMIZE, container, deployment_labels, env, rendered

OVERLAY = KUSTOMIZE / "inference-gateway"
POOL_GROUP = "inference.networking.k8s.io"
# llm-d-router v0.9.0, pkg/epp/framework/plugins/datalayer/extractor/metrics/factories.go: the vllm engine
ENGINE_LABEL = "llm-d.ai/engine-type"
VLLM_ENGINE = {"queuedRequestsSpec": "vllm:num_requests_waiting", "runningRequestsSpec": "vllm:num_requests_running",
               "kvUsageSpec": "vllm:kv_cache_usage_perc", "loraSpec": "vllm:lora_requests_info",
               "cacheInfoSpec": "vllm:cache_config_info"}  # fmt: skip
# the plugin types llm-d-router v0.9.0 registers that this config may name
KNOWN_PLUGINS = {"metrics-data-source", "core-metrics-extractor", "queue-scorer", "kv-cache-utilization-scorer",
                 "prefix-cache-scorer", "lora-affinity-scorer", "max-score-picker", "weighted-random-picker",
                 "session-affinity-scorer", "active-request-scorer"}  # fmt: skip


def overlay() -> dict:
    return yaml.safe_load((OVERLAY / "kustomization.yaml").read_text())


def overlay_docs() -> list[dict]:
    """What the overlay adds to the base (``../``), resource by resource."""
    docs = []
    for name in overlay()["resources"]:
        if name != "../":
            docs += [doc for doc in yaml.safe_load_all((OVERLAY / name).read_text()) if doc]
    return docs


def the(kind: str) -> dict:
    (found,) = [doc for doc in overlay_docs() if doc["kind"] == kind]
    return found


def epp() -> dict:
    (found,) = [d for d in overlay_docs() if d["kind"] == "Deployment" and d["metadata"]["name"] == "decoda-epp"]
    return found


def epp_args() -> dict[str, str]:
    (main,) = epp()["spec"]["template"]["spec"]["containers"]
    return dict(arg.removeprefix("--").split("=", 1) for arg in main["args"])


def epp_config() -> dict:
    (config_map,) = [d for d in overlay_docs() if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "decoda-epp"]
    (main,) = epp()["spec"]["template"]["spec"]["containers"]
    mounts = {m["name"]: m["mountPath"] for m in main["volumeMounts"]}
    volumes = {v["name"]: v for v in epp()["spec"]["template"]["spec"]["volumes"]}
    (volume,) = [name for name, v in volumes.items() if v.get("configMap", {}).get("name") == "decoda-epp"]
    path = Path(epp_args()["config-file"])
    assert str(path.parent) == mounts[volume], "the config file is not in the mounted ConfigMap"
    return yaml.safe_load(config_map["data"][path.name])


def test_the_overlay_is_the_base_plus_every_manifest_in_its_folder():
    resources = overlay()["resources"]
    assert resources[0] == "../"  # today's Service and everything else stay
    assert set(resources[1:]) == {path.name for path in OVERLAY.glob("*.yaml")} - {"kustomization.yaml"}
    kinds = {doc["kind"] for doc in overlay_docs()}
    assert kinds >= {"InferencePool", "InferenceObjective", "HTTPRoute", "Deployment", "Service", "ConfigMap",
                     "ServiceAccount", "Role", "RoleBinding"}  # fmt: skip
    base_names = {(doc["kind"], doc["metadata"]["name"]) for doc in rendered()}
    assert not base_names & {(doc["kind"], doc["metadata"]["name"]) for doc in overlay_docs()}


CUSTOM = [doc for doc in overlay_docs() if (doc["apiVersion"], doc["kind"]) in SCHEMAS]
CORE = [doc for doc in overlay_docs() if (doc["apiVersion"], doc["kind"]) not in SCHEMAS]


@pytest.mark.parametrize("doc", CORE, ids=lambda doc: f"{doc['kind']}/{doc['metadata']['name']}")
def test_kubernetes_kinds_validate_strictly(doc):
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


@pytest.mark.parametrize("doc", CUSTOM, ids=lambda doc: f"{doc['kind']}/{doc['metadata']['name']}")
def test_custom_resources_validate_against_their_crds(doc):
    jsonschema.validate(doc, SCHEMAS[(doc["apiVersion"], doc["kind"])])
    assert cel_errors(doc) == []


@pytest.mark.parametrize(
    ("kind", "change", "error"),
    [
        ("InferencePool", lambda spec: spec.update(targetPort=[{"number": 8000}]), jsonschema.ValidationError),
        ("InferencePool", lambda spec: spec["targetPorts"].append({"number": 8000}), "port number must be unique"),
        ("InferencePool", lambda spec: spec["endpointPickerRef"].pop("port"), "port is required"),
        ("InferencePool", lambda spec: spec.update(appProtocol="grpc"), jsonschema.ValidationError),
        ("InferenceObjective", lambda spec: spec.update(criticality="Critical"), jsonschema.ValidationError),
        ("HTTPRoute", lambda spec: spec["rules"][0].update(timeouts={"request": "1 hour"}), jsonschema.ValidationError),
        ("HTTPRoute", lambda spec: spec["rules"][0]["matches"][0]["path"].update(value="v1"), "not a valid absolute"),
    ],
    ids=["misspelt-field", "duplicate-port", "picker-without-port", "bad-protocol", "old-field", "bad-duration",
         "relative-path"],
)  # fmt: skip
def test_the_schemas_refuse_what_the_api_server_refuses(kind, change, error):
    """The checks above are not no-ops: a misspelt field, a broken bound or a CEL rule fails."""
    doc = yaml.safe_load(yaml.safe_dump(the(kind) if kind != "InferenceObjective" else
                                        [d for d in CUSTOM if d["kind"] == kind][0]))  # fmt: skip
    change(doc["spec"])
    if isinstance(error, str):
        jsonschema.validate(doc, SCHEMAS[(doc["apiVersion"], doc["kind"])])
        assert any(error in message for message in cel_errors(doc)), cel_errors(doc)
    else:
        with pytest.raises(error):
            jsonschema.validate(doc, SCHEMAS[(doc["apiVersion"], doc["kind"])])


def test_the_pool_selects_the_decoda_pods_on_their_port_and_names_the_picker():
    pool = the("InferencePool")["spec"]
    assert pool["selector"]["matchLabels"].items() <= deployment_labels().items()
    assert [port["number"] for port in pool["targetPorts"]] == [p["containerPort"] for p in container()["ports"]]
    picker = pool["endpointPickerRef"]
    (service,) = [d for d in overlay_docs() if d["kind"] == "Service" and d["metadata"]["name"] == picker["name"]]
    ports = {port["port"]: port for port in service["spec"]["ports"]}
    assert ports[picker["port"]["number"]]["appProtocol"] == "kubernetes.io/h2c"  # ext-proc is gRPC
    (main,) = epp()["spec"]["template"]["spec"]["containers"]
    target = ports[picker["port"]["number"]]["targetPort"]
    assert {p["name"]: p["containerPort"] for p in main["ports"]}[target] == int(epp_args()["grpc-port"])
    assert service["spec"]["selector"].items() <= epp()["spec"]["template"]["metadata"]["labels"].items()
    assert not pool["selector"]["matchLabels"].items() <= epp()["spec"]["template"]["metadata"]["labels"].items()


def test_the_picker_names_the_pool_and_reads_its_own_config():
    pool = the("InferencePool")
    args = epp_args()
    assert args["pool-name"] == pool["metadata"]["name"] and args["pool-group"] == POOL_GROUP
    (main,) = epp()["spec"]["template"]["spec"]["containers"]
    assert {item["name"] for item in main["env"]} >= {"NAMESPACE"}  # the pool's namespace: the picker's own
    assert main["image"].startswith("ghcr.io/llm-d/llm-d-router-endpoint-picker:v")
    probes = {main[probe]["grpc"]["port"] for probe in ("livenessProbe", "readinessProbe")}
    assert probes == {int(args["grpc-health-port"])}
    config = epp_config()
    assert config["apiVersion"] == "llm-d.ai/v1alpha1" and config["kind"] == "EndpointPickerConfig"
    declared = {plugin.get("name", plugin["type"]) for plugin in config["plugins"]}
    assert {plugin["type"] for plugin in config["plugins"]} <= KNOWN_PLUGINS
    for profile in config["schedulingProfiles"]:
        assert {ref["pluginRef"] for ref in profile["plugins"]} <= declared
    (source,) = [plugin for plugin in config["plugins"] if plugin["type"] == "metrics-data-source"]
    assert source["parameters"]["path"] == "/metrics"  # the pods' own metrics route
    (extractor,) = [plugin for plugin in config["plugins"] if plugin["type"] == "core-metrics-extractor"]
    assert extractor.get("parameters", {}).get("defaultEngine", "vllm") == "vllm"


def test_the_picker_may_read_the_pool_the_pods_and_the_objectives():
    role, binding = the("Role"), the("RoleBinding")
    account = epp()["spec"]["template"]["spec"]["serviceAccountName"]
    assert account == the("ServiceAccount")["metadata"]["name"]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}  # fmt: skip
    subjects = [{key: subject[key] for key in ("kind", "name")} for subject in binding["subjects"]]
    assert {"kind": "ServiceAccount", "name": account} in subjects
    granted = {(group, resource) for rule in role["rules"] if {"get", "watch", "list"} <= set(rule["verbs"])
               for group in rule["apiGroups"] for resource in rule["resources"]}  # fmt: skip
    assert {("", "pods"), (POOL_GROUP, "inferencepools"), ("llm-d.ai", "inferenceobjectives")} <= granted
    assert all(set(rule["verbs"]) <= {"get", "watch", "list"} for rule in role["rules"])  # reads only


def test_the_route_and_the_objectives_point_at_the_pool():
    pool_name = the("InferencePool")["metadata"]["name"]
    (rule,) = the("HTTPRoute")["spec"]["rules"]
    assert rule["backendRefs"] == [{"group": POOL_GROUP, "kind": "InferencePool", "name": pool_name}]
    assert rule["matches"] == [{"path": {"type": "PathPrefix", "value": "/"}}]
    objectives = [doc for doc in overlay_docs() if doc["kind"] == "InferenceObjective"]
    assert len(objectives) >= 2
    for objective in objectives:
        assert objective["spec"]["poolRef"] == {"group": POOL_GROUP, "name": pool_name}
    assert len({o["spec"]["priority"] for o in objectives}) == len(objectives)  # each a level of its own


def test_the_pods_serve_the_series_the_pickers_vllm_engine_reads():
    assert deployment_labels()[ENGINE_LABEL] == "vllm"
    compat = env()["DECODA_METRICS_COMPAT"]["value"]
    Settings(metrics_compat=compat).check()
    assert compat == "vllm"
    served = {*GAUGES, LORA_INFO[0], CACHE_INFO[0]}
    assert set(VLLM_ENGINE.values()) <= served
