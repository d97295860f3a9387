"""The NATS users the deployments ship (deploy/nats/loraplane-auth.conf, the ConfigMap
loraplane-nats of deploy/kubernetes) are loraplane/nats_permissions.py's, and the
Kubernetes registry and agents log in as their own user with the password the NATS
server reads. compose.yaml's side is in tests/test_compose.py; a real nats-server runs
the file in tests/core/test_nats_permissions.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from loraplane.nats_permissions import (
    AGENT_USER,
    PASSWORD_ENV,
    REGISTRY_USER,
    authorization_config,
)

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "deploy" / "nats" / "loraplane-auth.conf"
MANIFESTS = ROOT / "deploy" / "kubernetes"
Doc = dict[str, Any]


def _docs() -> list[Doc]:
    return [doc for path in sorted(MANIFESTS.glob("*.yaml"))
            for doc in yaml.safe_load_all(path.read_text()) if doc]


def _one(kind: str, name: str) -> Doc:
    (doc,) = [d for d in _docs() if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def _container(owner: Doc, name: str) -> Doc:
    containers: list[Doc] = owner["spec"]["template"]["spec"]["containers"]
    (container,) = [c for c in containers if c["name"] == name]
    return container


def test_the_shipped_config_is_the_generated_one() -> None:
    text = CONFIG.read_text()
    body = "".join(line + "\n" for line in text.splitlines() if not line.startswith("#"))
    assert body == authorization_config()
    for variable in PASSWORD_ENV.values():
        assert f"password: ${variable}\n" in body


def test_the_kubernetes_config_map_holds_the_same_file() -> None:
    data = _one("ConfigMap", "loraplane-nats")["data"]
    assert data == {CONFIG.name: CONFIG.read_text()}


def _password_ref(container: Doc) -> tuple[str, str]:
    (entry,) = [e for e in container["env"] if e["name"] == "LORAPLANE_NATS_PASSWORD"]
    ref = entry["valueFrom"]["secretKeyRef"]
    return str(ref["name"]), str(ref["key"])


def test_registry_and_agents_log_in_as_their_own_users() -> None:
    secret = _one("Secret", "loraplane-nats")["stringData"]
    assert set(secret) == set(PASSWORD_ENV.values())
    registry = _container(_one("Deployment", "loraplane-registry"), "registry")
    assert _one("ConfigMap", "loraplane-registry")["data"]["LORAPLANE_NATS_USER"] \
        == REGISTRY_USER
    assert _password_ref(registry) == ("loraplane-nats", PASSWORD_ENV[REGISTRY_USER])
    agent = _container(_one("StatefulSet", "vllm-agent"), "agent")
    users = [e["value"] for e in agent["env"] if e["name"] == "LORAPLANE_NATS_USER"]
    assert users == [AGENT_USER]
    assert _password_ref(agent) == ("loraplane-nats", PASSWORD_ENV[AGENT_USER])
    # The agents' secrets hold no registry credentials.
    assert "LORAPLANE_NATS_PASSWORD" not in _one("Secret", "loraplane-registry")["stringData"]
