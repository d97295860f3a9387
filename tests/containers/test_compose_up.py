"""`compose up` of compose.yaml as users run it, on the local images (deploy/compose.local.yaml):
every service healthy, the one-shots exit 0, a push from the host through the published
registry port reaches NATS, a client outside the network downloads through
S3_PUBLIC_ENDPOINT, and `down -v` leaves nothing behind."""

from __future__ import annotations

import json
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from devharness.adapters import make_adapter
from devharness.processes import clean_env, loraplane_command
from devharness.waiting import eventually
from loraplane.netutil import free_ports
from tests.compose_support import COMPOSE_FILE, ROOT

TOKEN = "lp_compose-up-" + secrets.token_hex(8)
HEALTHY = ("postgres", "nats", "s3", "registry")
ONE_SHOTS = ("createbucket", "migrate")


class Compose:
    def __init__(self, work: Path) -> None:
        self.project = "lptest" + secrets.token_hex(4)
        self.registry_port, self.s3_port = free_ports(2)
        # Test-only: S3 published on the host, so that a client outside the network can
        # use the presigned URLs (compose.yaml publishes only the registry).
        ports = work / "ports.yaml"
        ports.write_text(f'services:\n  s3:\n    ports: ["127.0.0.1:{self.s3_port}:8333"]\n')
        self.files = [COMPOSE_FILE, ROOT / "deploy" / "compose.local.yaml", ports]
        self.env = {**clean_env(), "REGISTRY_PORT": str(self.registry_port),
                    "S3_PUBLIC_ENDPOINT": self.s3_url, "LORAPLANE_ADMIN_TOKEN": TOKEN}

    @property
    def s3_url(self) -> str:
        return f"http://127.0.0.1:{self.s3_port}"

    @property
    def registry_url(self) -> str:
        return f"http://127.0.0.1:{self.registry_port}"

    def run(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        files = [arg for path in self.files for arg in ("-f", str(path))]
        return subprocess.run(["docker-compose", "-p", self.project, *files, *args],
                              cwd=ROOT, env=self.env, capture_output=True, text=True,
                              timeout=timeout, check=False)

    def state(self, service: str) -> dict[str, Any]:
        ids = self.run("ps", "-a", "-q", service).stdout.split()
        assert len(ids) == 1, f"{service}: containers {ids}"
        result = subprocess.run(["docker", "inspect", ids[0]], capture_output=True, text=True,
                                check=True)
        state: dict[str, Any] = json.loads(result.stdout)[0]["State"]
        return state

    def leftovers(self) -> list[str]:
        label = f"label=com.docker.compose.project={self.project}"
        found = []
        for kind in ("ps", "volume ls", "network ls"):
            command = ["docker", *kind.split(), "-q", "--filter", label]
            if kind == "ps":
                command.insert(2, "-a")
            found += subprocess.run(command, capture_output=True, text=True,
                                    check=True).stdout.split()
        return found


def cli_push(compose: Compose, folder: Path) -> None:
    """``loraplane adapters create`` and ``push`` from the host, through the published port."""
    env = clean_env({"LORAPLANE_REGISTRY": compose.registry_url, "LORAPLANE_TOKEN": TOKEN})
    for args in (["adapters", "create", "composed", "--base-model", "tiny-llama",
                  "--tenant", "acme"], ["push", "composed", str(folder), "--alias", "live"]):
        result = subprocess.run([*loraplane_command(), *args], env=env, capture_output=True,
                                text=True, timeout=120, check=False)
        assert result.returncode == 0, result.stderr


@pytest.fixture
def compose(local_images: None, tmp_path: Path) -> Iterator[Compose]:
    project = Compose(tmp_path)
    try:
        yield project
    finally:
        down = project.run("down", "-v", "--remove-orphans")
        assert down.returncode == 0, down.stderr
    assert project.leftovers() == [], "compose down -v left these behind"


async def test_compose_up_runs_the_whole_file(compose: Compose, tmp_path: Path) -> None:
    up = compose.run("up", "-d", timeout=600)
    assert up.returncode == 0, up.stderr

    def every_service_healthy() -> bool:
        return all(compose.state(s).get("Health", {}).get("Status") == "healthy"
                   for s in HEALTHY)

    await eventually(every_service_healthy, timeout_s=180,
                     what=f"{', '.join(HEALTHY)} healthy")
    for service in ONE_SHOTS:
        state = compose.state(service)
        assert (state["Status"], state["ExitCode"]) == ("exited", 0), (service, state)

    folder = make_adapter(tmp_path / "adapter", seed=7)
    cli_push(compose, folder)

    def stream_messages() -> int | None:
        out = compose.run("exec", "-T", "nats", "wget", "-q", "-O", "-",
                          "http://127.0.0.1:8222/jsz?streams=true").stdout
        streams = json.loads(out)["account_details"][0]["stream_detail"]
        count = sum(int(s["state"]["messages"]) for s in streams)
        return count or None

    await eventually(stream_messages, timeout_s=60, what="the push's events in NATS")
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(base_url=compose.registry_url, timeout=30) as client:
        redirect = await client.get("/v1/adapters/composed/versions/1/files/adapter_config.json",
                                    headers=headers)
        assert redirect.status_code == 307, redirect.text
        location = redirect.headers["location"]
        assert location.startswith(compose.s3_url), location
        blob = await client.get(location)
    assert blob.status_code == 200, blob.text
    assert blob.content == (folder / "adapter_config.json").read_bytes()
