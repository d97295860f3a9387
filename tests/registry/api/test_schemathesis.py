"""schemathesis against the real registry over HTTP: the API does what its OpenAPI says.

Every operation, as an admin so the authorised paths run, on each backend. A server
error, a status the description does not list, or a body or content type that breaks
it fails the test. The run is derandomized and bounded so it takes the same cases, and
about the same time, on every CI run.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

from devharness.adapters import make_adapter
from devharness.http_registry import serve_http
from devharness.services import NatsService, PostgresDatabase, SeaweedS3
from devharness.uploads import upload_dir
from tests.registry.api.schemathesis_hooks import KEEP_TOKEN_ENV, SEEDED

ROOT = Path(__file__).resolve().parents[3]

CHECKS = ("not_a_server_error", "status_code_conformance", "response_schema_conformance",
          "content_type_conformance", "allow_header_conformance")
# Cases per operation and phase: enough to reach every documented branch of the
# small API, few enough that both backends take about two minutes together on a
# loaded 2-core machine.
MAX_EXAMPLES = 25


def _schemathesis_args(url: str, token: str, report: Path) -> list[str]:
    return [
        sys.executable, "-m", "schemathesis.cli", "run", f"{url}/openapi.json",
        "--checks", ",".join(CHECKS), "--header", f"Authorization: Bearer {token}",
        "--max-examples", str(MAX_EXAMPLES),
        # Derandomized: every run sends the same cases (schemathesis ignores a seed then).
        "--generation-deterministic",
        "--phases", "examples,coverage,fuzzing,stateful", "--workers", "1",
        "--request-timeout", "30", "--no-color", "--suppress-health-check", "all",
        "--report", "junit", "--report-junit-path", str(report),
    ]


async def test_registry_conforms_to_its_openapi(
        request: pytest.FixtureRequest, backend: str, tmp_path: Path,
        nats: NatsService) -> None:
    pg: PostgresDatabase | None = None
    s3: SeaweedS3 | None = None
    if backend == "postgres_s3":
        pg = request.getfixturevalue("postgres")
        s3 = request.getfixturevalue("seaweed")
    async with serve_http(backend, tmp_path / "data", nats, pg, s3) as served:
        harness = served.harness
        name = str(SEEDED["name"])
        await harness.create_adapter(name)
        uploaded = await upload_dir(harness, name, make_adapter(tmp_path / "lora"),
                                    aliases=str(SEEDED["alias"]))
        assert uploaded.status_code == 201, uploaded.text
        tokens = await harness.client.get("/v1/tokens", headers=harness.admin_headers)
        admin_id = next(t["id"] for t in tokens.json()["tokens"] if t["role"] == "admin")
        env = {**os.environ, "PYTHONPATH": str(ROOT), KEEP_TOKEN_ENV: str(admin_id),
               "SCHEMATHESIS_HOOKS": "tests.registry.api.schemathesis_hooks"}
        process = await asyncio.create_subprocess_exec(
            *_schemathesis_args(served.url, served.admin_token, tmp_path / "junit.xml"),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            cwd=tmp_path, env=env)
        output, _ = await process.communicate()
    text = output.decode(errors="replace")
    print(text)
    assert process.returncode == 0, f"schemathesis found failures:\n{text}"
