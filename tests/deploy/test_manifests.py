"""deploy/: the Kubernetes manifests validate offline and agree with the server.

Built-in kinds are checked against the Kubernetes OpenAPI schemas that the
kubernetes-validate package ships (no cluster, no network); the Gateway API and
inference-extension kinds against the JSON schemas committed in
deploy/kubernetes/schemas/. The cross-checks tie the files together: the endpoint
picker's metric flags name metrics the server exports, the pool selects the model
server pods on their port, and the image runs as the user the pods require.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml
from helios_serve.metrics import Metrics

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
K8S = DEPLOY / "kubernetes"
K8S_VERSION = "1.33.0"
SCHEMAS = {
    ("inference.networking.k8s.io/v1", "InferencePool"): "inferencepool.v1.json",
    ("inference.networking.x-k8s.io/v1alpha2", "InferenceObjective"):
        "inferenceobjective.v1alpha2.json",
    ("gateway.networking.k8s.io/v1", "HTTPRoute"): "httproute.v1.json",
}
# The endpoint picker's flags for the model-server protocol metrics (docs/deploy.md).
METRIC_FLAGS = ("--total-queued-requests-metric", "--total-running-requests-metric",
                "--kv-cache-usage-percentage-metric", "--lora-info-metric", "--cache-info-metric")


def _documents() -> list[dict]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        docs.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    return docs


def _validate(doc: dict) -> None:
    """Raises jsonschema / kubernetes_validate ValidationError for an invalid document."""
    schema = SCHEMAS.get((doc["apiVersion"], doc["kind"]))
    if schema is not None:
        jsonschema.validate(doc, json.loads((K8S / "schemas" / schema).read_text()))
    else:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def _one(kind: str, name: str) -> dict:
    (doc,) = [d for d in _documents() if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def test_every_document_validates_offline():
    docs = _documents()
    kinds = sorted({d["kind"] for d in docs})
    assert kinds == ["Deployment", "HTTPRoute", "InferenceObjective", "InferencePool", "Role",
                     "RoleBinding", "Service", "ServiceAccount"]
    for doc in docs:
        _validate(doc)


@pytest.mark.parametrize(("kind", "name", "path", "value", "error"), [
    ("Deployment", "helios-smollm2", ("spec", "replicas"), "two",
     kubernetes_validate.ValidationError),
    ("Deployment", "helios-smollm2", ("spec", "template", "spec", "nodeSelectr"), {},
     kubernetes_validate.ValidationError),  # strict: a misspelt field is an error
    ("InferencePool", "helios-smollm2", ("spec", "targetPorts"), [{"number": 70000}],
     jsonschema.ValidationError),
    ("InferencePool", "helios-smollm2", ("spec", "extensionRef", "failureMode"), "FailSoft",
     jsonschema.ValidationError),
    ("InferenceObjective", "helios-smollm2-interactive", ("spec", "criticality"), "Critical",
     jsonschema.ValidationError),  # InferenceModel's field: not in the v1 successor
])
def test_a_broken_document_is_rejected(kind, name, path, value, error):
    doc = _one(kind, name)
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(error):
        _validate(doc)


def _args(container: dict) -> dict[str, str]:
    args = container["args"]
    return {a: args[i + 1] for i, a in enumerate(args) if a.startswith("--") and i + 1 < len(args)}


def test_the_picker_reads_metrics_the_server_exports():
    epp = _one("Deployment", "helios-smollm2-epp")["spec"]["template"]["spec"]["containers"][0]
    args = _args(epp)
    exported = {family.name for family in Metrics().registry.collect()}
    assert {flag: args[flag] for flag in METRIC_FLAGS} == {
        "--total-queued-requests-metric": "helios_requests_waiting",
        "--total-running-requests-metric": "helios_requests_running",
        "--kv-cache-usage-percentage-metric": "helios_kv_cache_usage_perc",
        "--lora-info-metric": "helios_lora_requests_info",
        "--cache-info-metric": "helios_cache_config_info",
    }
    assert {args[flag] for flag in METRIC_FLAGS} <= exported
    assert args["--pool-name"] == _one("InferencePool", "helios-smollm2")["metadata"]["name"]


def test_the_pool_and_service_select_the_model_server_pods_on_their_port():
    server = _one("Deployment", "helios-smollm2")
    pod = server["spec"]["template"]
    labels = pod["metadata"]["labels"]
    (container,) = pod["spec"]["containers"]
    (port,) = container["ports"]
    assert _args(container)["--port"] == str(port["containerPort"]) == "8000"
    pool = _one("InferencePool", "helios-smollm2")["spec"]
    assert pool["selector"]["matchLabels"].items() <= labels.items()
    assert pool["targetPorts"] == [{"number": port["containerPort"]}]
    assert pool["extensionRef"]["name"] == _one("Service", "helios-smollm2-epp")["metadata"]["name"]
    service = _one("Service", "helios-smollm2")["spec"]
    assert service["selector"].items() <= labels.items()
    # The core and the trust key are read-only mounts; the key comes from a Secret.
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert mounts["core"]["readOnly"] and volumes["core"]["persistentVolumeClaim"]["readOnly"]
    assert mounts["trust"]["readOnly"] and "secret" in volumes["trust"]
    assert _args(container)["--trust"].startswith(mounts["trust"]["mountPath"] + "/")
    assert container["args"][0].startswith(mounts["core"]["mountPath"] + "/")
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["path"] == "/health"


def test_the_image_is_multi_stage_and_runs_as_the_pods_user():
    text = (DEPLOY / "Containerfile").read_text()
    assert len(re.findall(r"^FROM ", text, re.M)) == 2
    (user,) = re.findall(r"^USER (\d+):(\d+)$", text, re.M)
    security = _one("Deployment", "helios-smollm2")["spec"]["template"]["spec"]["securityContext"]
    assert (security["runAsUser"], security["runAsGroup"]) == tuple(map(int, user)) != (0, 0)
    assert security["runAsNonRoot"] is True
