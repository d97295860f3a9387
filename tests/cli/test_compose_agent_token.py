"""compose.yaml's one-shot ``agent-token``, run for real: its script, as compose runs it
(``/bin/sh -ec``), against a real ``loraplane registry serve`` with the real CLI.

It must leave an agent token (never the admin token) in a file only its owner reads,
keep it across restarts, store a given token instead of creating one, and the agent must
start from that file.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import httpx

from inference_agent.settings import AgentSettings
from tests.cli.conftest import ServedRegistry, clean_env
from tests.compose_support import environment, interpolate, load_compose


def run_script(served: ServedRegistry, token_file: Path, **extra: str) -> None:
    service = load_compose()["services"]["agent-token"]
    assert service["entrypoint"][:2] == ["/bin/sh", "-ec"]
    env = {k: interpolate(v) for k, v in environment(service).items()}
    admin = (served.data_dir / "admin-token").read_text().strip()
    env.update(LORAPLANE_REGISTRY=served.url, LORAPLANE_TOKEN=admin,
               TOKEN_FILE=str(token_file), **extra)
    # The image's PATH has the `loraplane` console script; here it is beside python.
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    done = subprocess.run(["/bin/sh", "-ec", interpolate(service["command"][0])],
                          env=clean_env(**env, PATH=path), capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr


def tokens(served: ServedRegistry) -> list[dict[str, object]]:
    found: list[dict[str, object]] = served.get("/v1/tokens")["tokens"]
    return found


def test_agent_token_is_created_once_with_role_agent(served: ServedRegistry,
                                                     tmp_path: Path) -> None:
    token_file = tmp_path / "agent-token"
    before = len(tokens(served))
    run_script(served, token_file, AGENT_ID="gpu-7", GIVEN_AGENT_TOKEN="")
    secret = token_file.read_text().strip()
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    created = [t for t in tokens(served) if t["name"] == "gpu-7"]
    assert len(tokens(served)) == before + 1 and [t["role"] for t in created] == ["agent"]
    assert [t["agent_id"] for t in created] == ["gpu-7"]
    assert secret != (served.data_dir / "admin-token").read_text().strip()

    # A restart of the stack finds the file and leaves it (and the registry) alone.
    run_script(served, token_file, AGENT_ID="gpu-7", GIVEN_AGENT_TOKEN="")
    assert token_file.read_text().strip() == secret and len(tokens(served)) == before + 1

    # The token is an agent's: it reads what agents read, reports for gpu-7 only, and may
    # not administer the registry.
    headers = {"Authorization": f"Bearer {secret}"}
    assert httpx.get(f"{served.url}/v1/agents/credentials", headers=headers).status_code == 200
    assert httpx.get(f"{served.url}/v1/tokens", headers=headers).status_code == 403
    other = httpx.post(f"{served.url}/v1/agents/gpu-9/status", headers=headers,
                       json={"agent_id": "gpu-9", "base_model": "base", "served": [],
                             "time": "2026-01-01T00:00:00Z"})
    assert (other.status_code, other.json()["error"]["code"]) == (403, "agent_id_forbidden")

    settings = AgentSettings(registry=served.url, token_file=token_file, base_model="base")
    assert settings.token is not None and settings.token.get_secret_value() == secret


def test_a_given_agent_token_is_stored_instead(served: ServedRegistry, tmp_path: Path) -> None:
    token_file = tmp_path / "agent-token"
    before = len(tokens(served))
    run_script(served, token_file, AGENT_ID="gpu-8", GIVEN_AGENT_TOKEN="lp_given-by-operator")
    assert token_file.read_text().strip() == "lp_given-by-operator"
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert len(tokens(served)) == before
