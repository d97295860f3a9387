"""The README's webhook gate runs as written: a canary whose golden prompts the canary
version answers passes its gate and takes traffic; one that answers them wrong is
rolled back with the gate's count as the reason. The gate is the README's code in a
process of its own; the agent it asks is a stand-in that answers per version."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from devharness.processes import http_probe
from devharness.registry import RegistryHarness
from loraplane.netutil import free_port
from loraplane.process import ChildProcess
from registry_service.canaries.webhooks import webhook_secret
from registry_service.settings import WEBHOOK_SECRET_FILE
from tests.agent.proxy_harness import serve_asgi
from tests.docs.doc_blocks import ROOT, blocks
from tests.registry.canaries import support as c

TOKEN = "lp_test-gate-token"


def gate_code() -> str:
    found = [b.code for b in blocks(ROOT / "README.md")
             if b.lang == "python" and "X-Loraplane-Signature" in b.code]
    assert len(found) == 1, "the README should show one webhook gate"
    return found[0]


async def agent(request: Request) -> Response:
    """An agent's completions: each version of ``bot`` answers its own words."""
    if request.headers.get("authorization") != f"Bearer {TOKEN}":
        return JSONResponse({"error": {"message": "no"}}, status_code=401)
    model = (await request.json())["model"]
    return JSONResponse({"choices": [{"text": f" the answer of {model}"}]})


async def test_the_readme_gate_passes_a_good_version_and_fails_a_wrong_one(
    registry: RegistryHarness, tmp_path: Path,
) -> None:
    registry.ctx.settings.canary_webhook_hosts = ["127.0.0.1"]
    webhook_secret(registry.settings)  # the file the registry signs with, made now
    (tmp_path / "gate.py").write_text(gate_code())
    (tmp_path / "golden.json").write_text(json.dumps([{"prompt": "hi", "expect": "bot@2"}]))
    port = free_port()
    routes = [Route("/v1/completions", agent, methods=["POST"])]
    async with serve_asgi(Starlette(routes=routes)) as agent_url:
        env = {**os.environ, "AGENT_URL": agent_url, "AGENT_TOKEN": TOKEN,
               "GATE_PORT": str(port),
               "GATE_SECRET_FILE": str(registry.settings.data_dir / WEBHOOK_SECRET_FILE)}
        process = ChildProcess("gate", [sys.executable, str(tmp_path / "gate.py"),
                                        str(tmp_path / "golden.json")],
                               env=env, log_path=tmp_path / "gate.log")
        process.start()
        try:
            # It answers only POST: a GET's 501 says it listens.
            await asyncio.to_thread(process.wait_ready,
                                    http_probe(f"http://127.0.0.1:{port}/", ok=(501,)), 60)
            await _judged(registry, tmp_path, f"http://127.0.0.1:{port}/")
        finally:
            process.stop()


async def _judged(registry: RegistryHarness, tmp_path: Path, gate: str) -> None:
    hook = {"webhooks": [{"name": "golden", "url": gate, "phase": "pre"}]}
    await c.running(registry, tmp_path, analysis={**c.ANALYSIS, **hook})
    passed = await c.canary_when(registry, step=1)
    assert passed["weight"] == 10, passed
    status, _ = await c.call(registry, "POST", f"{c.CANARY}/abort")
    assert status == 200
    status, _ = await c.start_canary(registry, version=3, analysis={**c.ANALYSIS, **hook})
    assert status == 201
    failed = await c.canary_when(registry, state="aborted", canary_version=3)
    assert failed["reason"].endswith("webhook golden answered 500: 1 of 1 golden prompts "
                                     "wrong"), failed
