"""The openAPIV3Schema of the custom resources deploy/kubernetes/inference-gateway uses, as JSON Schema.

kubernetes-validate ships Kubernetes' own kinds only, and the tests run offline, so these were written
here from the upstream CustomResourceDefinitions, limited to the fields our manifests set (every other
field is refused here, where the API server would accept it: a manifest using a new field must add it):

- InferencePool ``inference.networking.k8s.io/v1``: kubernetes-sigs/gateway-api-inference-extension
  v1.6.0, ``config/crd/bases/inference.networking.k8s.io_inferencepools.yaml`` (its whole ``spec``);
- InferenceObjective ``llm-d.ai/v1alpha2``: llm-d/llm-d-router v0.9.0,
  ``config/crd/bases/llm-d.ai_inferenceobjectives.yaml`` (its whole ``spec``; the API moved there from
  ``inference.networking.x-k8s.io`` when the inference extension handed its endpoint picker over);
- HTTPRoute ``gateway.networking.k8s.io/v1``: kubernetes-sigs/gateway-api v1.6.1 (standard channel),
  ``config/crd/standard/gateway.networking.k8s.io_httproutes.yaml``: parentRefs, rules' path matches,
  backendRefs and timeouts.

Types, bounds, patterns, enums and required fields are the CRDs'; ``additionalProperties: false`` is
what a structural schema does to an unknown field under strict field validation (``kubectl apply``'s
default). The CEL rules (``x-kubernetes-validations``) of those fields are ``cel_errors`` below.
"""

from __future__ import annotations

import re
from typing import Any

DNS_GROUP = r"^$|^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
KIND = r"^[a-zA-Z]([-a-zA-Z0-9]*[a-zA-Z0-9])?$"
NAMESPACE = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
DURATION = r"^([0-9]{1,5}(h|m|s|ms)){1,4}$"
PATH_CHARACTERS = r"^(?:[-A-Za-z0-9/._~!$&'()*+,;=:@]|[%][0-9a-fA-F]{2})+$"


def strict(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "properties": properties, "additionalProperties": False}
    if required:
        schema["required"] = list(required)
    return schema


def string(max_length: int | None = None, min_length: int | None = None, pattern: str | None = None,
           enum: list[str] | None = None) -> dict[str, Any]:  # fmt: skip
    schema: dict[str, Any] = {"type": "string"}
    for key, value in (("maxLength", max_length), ("minLength", min_length), ("pattern", pattern), ("enum", enum)):
        if value is not None:
            schema[key] = value
    return schema


PORT_NUMBER = {"type": "integer", "minimum": 1, "maximum": 65535}
METADATA = {"type": "object", "required": ["name"]}  # ObjectMeta: kubernetes-validate's own rules elsewhere


def resource(api_version: str, kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    return strict({"apiVersion": {"const": api_version}, "kind": {"const": kind}, "metadata": METADATA,
                   "spec": spec}, ("apiVersion", "kind", "metadata", "spec"))  # fmt: skip


INFERENCE_POOL = resource("inference.networking.k8s.io/v1", "InferencePool", strict({
    "appProtocol": string(enum=["http", "kubernetes.io/h2c"]),
    "endpointPickerRef": strict({
        "failureMode": string(enum=["FailOpen", "FailClose"]),
        "group": string(253, 0, DNS_GROUP),
        "kind": string(63, 1, KIND),
        "name": string(253, 1),
        "port": strict({"number": PORT_NUMBER}, ("number",)),
    }, ("name",)),
    "selector": strict({
        "matchLabels": {"type": "object", "minProperties": 1, "maxProperties": 64,
                        "additionalProperties": string(63, 0, LABEL_VALUE)},
    }, ("matchLabels",)),
    "targetPorts": {"type": "array", "minItems": 1, "maxItems": 8,
                    "items": strict({"number": PORT_NUMBER}, ("number",))},
}, ("selector", "targetPorts")))  # fmt: skip

INFERENCE_OBJECTIVE = resource("llm-d.ai/v1alpha2", "InferenceObjective", strict({
    "poolRef": strict({
        "group": string(253, None, DNS_GROUP),
        "kind": string(63, 1, KIND),
        "name": string(253, 1),
    }, ("name",)),
    "priority": {"type": "integer", "minimum": -(2**31), "maximum": 2**31 - 1},
}, ("poolRef",)))  # fmt: skip

PARENT_REF = strict({
    "group": string(253, None, DNS_GROUP),
    "kind": string(63, 1, KIND),
    "name": string(253, 1),
    "namespace": string(63, 1, NAMESPACE),
    "port": PORT_NUMBER,
    "sectionName": string(253, 1, DNS_GROUP.removeprefix("^$|")),
}, ("name",))  # fmt: skip
BACKEND_REF = strict({
    "group": string(253, None, DNS_GROUP),
    "kind": string(63, 1, KIND),
    "name": string(253, 1),
    "namespace": string(63, 1, NAMESPACE),
    "port": PORT_NUMBER,
    "weight": {"type": "integer", "minimum": 0, "maximum": 1000000},
}, ("name",))  # fmt: skip
PATH_MATCH = strict({
    "type": string(enum=["Exact", "PathPrefix", "RegularExpression"]),
    "value": string(1024),
})  # fmt: skip
HTTP_ROUTE = resource("gateway.networking.k8s.io/v1", "HTTPRoute", strict({
    "parentRefs": {"type": "array", "maxItems": 32, "items": PARENT_REF},
    "rules": {"type": "array", "minItems": 1, "maxItems": 16, "items": strict({
        "matches": {"type": "array", "maxItems": 64, "items": strict({"path": PATH_MATCH})},
        "backendRefs": {"type": "array", "maxItems": 16, "items": BACKEND_REF},
        "timeouts": strict({"request": string(pattern=DURATION), "backendRequest": string(pattern=DURATION)}),
    })},
}))  # fmt: skip

SCHEMAS = {
    ("inference.networking.k8s.io/v1", "InferencePool"): INFERENCE_POOL,
    ("llm-d.ai/v1alpha2", "InferenceObjective"): INFERENCE_OBJECTIVE,
    ("gateway.networking.k8s.io/v1", "HTTPRoute"): HTTP_ROUTE,
}


def _seconds(duration: str) -> float:
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001}
    return sum(int(n) * units[u] for n, u in re.findall(r"([0-9]+)(h|ms|m|s)", duration))


def cel_errors(doc: dict[str, Any]) -> list[str]:
    """The CRDs' CEL rules on the fields above (their messages), evaluated by hand."""
    errors: list[str] = []
    spec = doc.get("spec", {})
    if doc["kind"] == "InferencePool":
        numbers = [port["number"] for port in spec.get("targetPorts", [])]
        if len(numbers) != len(set(numbers)):
            errors.append("port number must be unique")
        picker = spec.get("endpointPickerRef", {})
        if picker.get("kind", "Service") == "Service" and "port" not in picker:
            errors.append("port is required when kind is 'Service' or unspecified (defaults to 'Service')")
    if doc["kind"] == "HTTPRoute":
        rules = spec.get("rules", [])
        if sum(len(rule.get("matches", [])) for rule in rules) > 128:
            errors.append("the total number of matches across all rules in a route must be less than 128")
        for rule in rules:
            for backend in rule.get("backendRefs", []):
                service = backend.get("group", "") == "" and backend.get("kind", "Service") == "Service"
                if service and "port" not in backend:
                    errors.append("Must have port for Service reference")
            timeouts = rule.get("timeouts", {})
            if "request" in timeouts and "backendRequest" in timeouts and _seconds(timeouts["request"]) != 0:
                if _seconds(timeouts["backendRequest"]) > _seconds(timeouts["request"]):
                    errors.append("backendRequest timeout cannot be longer than request timeout")
            for match in rule.get("matches", []):
                path = match.get("path", {})
                kind, value = path.get("type", "PathPrefix"), path.get("value", "/")
                if kind in ("Exact", "PathPrefix"):
                    forbidden = any(s in value for s in ("//", "/./", "/../", "%2f", "%2F", "#"))
                    bad = (not value.startswith("/") or forbidden or value.endswith(("/..", "/."))
                           or not re.match(PATH_CHARACTERS, value))  # fmt: skip
                    if bad:
                        errors.append(f"path {value!r} is not a valid absolute path for type {kind}")
    return errors
