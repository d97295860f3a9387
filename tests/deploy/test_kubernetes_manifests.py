"""The Kubernetes reference deployment (deploy/kubernetes/) is valid and fits together.

Kubernetes' own kinds are validated by kubernetes-validate against Kubernetes' schemas,
strictly (an unknown field is an error), for the oldest and newest versions below. The
custom resources (InferencePool, HTTPRoute) are validated against JSON schemas derived
from their CRDs (deploy/kubernetes/schemas/, made by scripts/crd_schema.py): the CRDs'
CEL rules are not checked, only an API server runs them. The endpoint picker's config
is no Kubernetes object (a file in a ConfigMap): its structure is checked here against
what llm-d's router reads. Nothing here runs on a cluster.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType
from typing import Any

import jsonschema
import pytest
import yaml

from inference_agent.serving.model_server_metrics import MODEL_SERVER_METRICS_PATH

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "deploy" / "kubernetes"
SCHEMAS = MANIFESTS / "schemas"
KUBERNETES_VERSIONS = ("1.31.0", "1.37.0")
CRD_SCHEMAS = {("inference.networking.k8s.io/v1", "InferencePool"): "inferencepool-v1.json",
               ("gateway.networking.k8s.io/v1", "HTTPRoute"): "httproute-v1.json"}
# Plugin types of llm-d's router (v0.9.0 and later) this deployment may name.
LLMD_PLUGIN_TYPES = frozenset({"metrics-data-source", "core-metrics-extractor",
                               "lora-affinity-scorer", "queue-scorer",
                               "kv-cache-utilization-scorer", "max-score-picker"})
Doc = dict[str, Any]


@pytest.fixture(scope="module")
def kubernetes_validate() -> ModuleType:
    try:
        import kubernetes_validate
    except ImportError:
        pytest.fail("kubernetes-validate is not installed: it is a dev extra "
                    "(.venv/bin/pip install -e '.[dev]', as scripts/setup.sh does)")
    module: ModuleType = kubernetes_validate
    return module


def manifests() -> list[tuple[str, Doc]]:
    found = [(path.name, doc) for path in sorted(MANIFESTS.glob("*.yaml"))
             for doc in yaml.safe_load_all(path.read_text()) if doc]
    assert found, f"no manifests in {MANIFESTS}"
    return found


def problems(doc: Doc, validator: ModuleType) -> list[str]:
    """Every reason ``doc`` is invalid (none: valid)."""
    key = (doc.get("apiVersion"), doc.get("kind"))
    if key in CRD_SCHEMAS:
        schema = json.loads((SCHEMAS / CRD_SCHEMAS[key]).read_text())
        return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
                for e in jsonschema.Draft7Validator(schema).iter_errors(doc)]
    found = []
    for version in KUBERNETES_VERSIONS:
        try:
            validator.validate(doc, version, strict=True)
        except validator.ValidationError as exc:
            found.append(f"Kubernetes {version}: {exc.message}")
        except validator.SchemaNotFoundError:
            found.append(f"Kubernetes {version} has no schema for {key}")
    return found


def test_every_manifest_is_valid(kubernetes_validate: ModuleType) -> None:
    docs = manifests()
    failures = {f"{name}: {doc['kind']}/{doc['metadata']['name']}": found
                for name, doc in docs if (found := problems(doc, kubernetes_validate))}
    assert not failures, json.dumps(failures, indent=1)
    assert {kind for _name, doc in docs for kind in [doc["kind"]]} >= {
        "Deployment", "StatefulSet", "Service", "Secret", "ConfigMap", "InferencePool",
        "HTTPRoute", "Role", "RoleBinding", "ServiceAccount", "Job", "Namespace"}


def test_the_checks_refuse_what_a_cluster_would(kubernetes_validate: ModuleType) -> None:
    docs = {doc["kind"]: doc for _name, doc in manifests()}
    service = {**docs["Service"], "spec": {**docs["Service"]["spec"], "bogus": 1}}
    assert problems(service, kubernetes_validate)
    pool = json.loads(json.dumps(docs["InferencePool"]))
    pool["spec"]["targetPorts"] = [{"number": 70000}]
    assert problems(pool, kubernetes_validate)
    del pool["spec"]["selector"]
    assert any("selector" in p for p in problems(pool, kubernetes_validate))
    route = json.loads(json.dumps(docs["HTTPRoute"]))
    route["spec"]["rules"][0]["backendRefs"][0]["weight"] = "heavy"
    assert problems(route, kubernetes_validate)
    unknown = {"apiVersion": "example.com/v1", "kind": "Nothing", "metadata": {"name": "x"}}
    assert problems(unknown, kubernetes_validate)


def _one(kind: str, name: str | None = None) -> Doc:
    (doc,) = [d for _n, d in manifests()
              if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    return doc


def _container(pod_owner: Doc, name: str) -> Doc:
    containers: list[Doc] = pod_owner["spec"]["template"]["spec"]["containers"]
    (container,) = [c for c in containers if c["name"] == name]
    return container


def _flag(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def _env(container: Doc, name: str) -> str:
    (value,) = [e["value"] for e in container["env"] if e["name"] == name]
    return str(value)


def test_vllm_is_reachable_from_its_agent_only() -> None:
    pods = _one("StatefulSet", "vllm-agent")
    vllm, agent = _container(pods, "vllm"), _container(pods, "agent")
    assert _flag(vllm["args"], "--host") == "127.0.0.1"
    assert "ports" not in vllm, "vLLM declares no port of the Pod"
    assert _env(agent, "LORAPLANE_VLLM_URL") == f"http://127.0.0.1:{_flag(vllm['args'], '--port')}"
    # vLLM loads versions from the agent's cache, under the agent's own paths.
    cache = {m["name"]: m["mountPath"] for m in agent["volumeMounts"]}["agent-cache"]
    assert {m["name"]: m["mountPath"] for m in vllm["volumeMounts"]}["agent-cache"] == cache
    assert _env(agent, "LORAPLANE_CACHE_DIR").startswith(cache + "/")
    # One agent token per Pod, from the Secret, named after the Pod (its agent id).
    assert _flag(agent["args"], "--agent-id") == "$(POD_NAME)"
    token_file = _flag(agent["args"], "--token-file")
    mounts = {m["name"]: m["mountPath"] for m in agent["volumeMounts"]}
    assert token_file == f"{mounts['agent-tokens']}/$(POD_NAME)"
    tokens = _one("Secret", "loraplane-agent-tokens")["stringData"]
    assert set(tokens) == {f"vllm-agent-{i}" for i in range(pods["spec"]["replicas"])}


def test_the_pool_and_the_picker_point_at_the_agents() -> None:
    pods = _one("StatefulSet", "vllm-agent")
    agent = _container(pods, "agent")
    pool = _one("InferencePool")["spec"]
    labels = pods["spec"]["template"]["metadata"]["labels"]
    assert pool["selector"]["matchLabels"].items() <= labels.items()
    agent_port = int(_flag(agent["args"], "--port"))
    assert [p["number"] for p in pool["targetPorts"]] == [agent_port]
    assert {p["containerPort"] for p in agent["ports"]} == {agent_port}
    # The picker: its Service and port, and the pool it serves.
    epp_service = _one("Service", pool["endpointPickerRef"]["name"])
    assert pool["endpointPickerRef"]["port"]["number"] in {
        p["port"] for p in epp_service["spec"]["ports"]}
    epp = _container(_one("Deployment", "loraplane-epp"), "epp")
    assert _flag(epp["args"], "--pool-name") == _one("InferencePool")["metadata"]["name"]
    route = _one("HTTPRoute")["spec"]["rules"][0]["backendRefs"][0]
    assert (route["kind"], route["name"]) == ("InferencePool", "loraplane-pool")


def test_the_picker_config_scores_lora_affinity_from_the_agents_metrics() -> None:
    config_map = _one("ConfigMap", "loraplane-epp")
    epp = _container(_one("Deployment", "loraplane-epp"), "epp")
    config_file = Path(_flag(epp["args"], "--config-file"))
    config = yaml.safe_load(config_map["data"][config_file.name])
    assert (config["apiVersion"], config["kind"]) == ("llm-d.ai/v1alpha1",
                                                      "EndpointPickerConfig")
    plugins = {p.get("name", p["type"]): p for p in config["plugins"]}
    assert {p["type"] for p in plugins.values()} <= LLMD_PLUGIN_TYPES
    source = plugins["metrics-data-source"].get("parameters", {})
    # No port override: the picker scrapes the pool's target port, the agent's, on the
    # path where the agent serves the protocol's series alone.
    assert source["path"] == MODEL_SERVER_METRICS_PATH and "port" not in source
    assert "core-metrics-extractor" in plugins
    (profile,) = config["schedulingProfiles"]
    refs = {ref["pluginRef"]: ref.get("weight") for ref in profile["plugins"]}
    assert set(refs) <= set(plugins), "every pluginRef names a declared plugin"
    assert refs["lora-affinity-scorer"] == max(w for w in refs.values() if w is not None)
