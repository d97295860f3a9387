"""A bad version never reaches vLLM; the good one keeps serving; the fleet view says why."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from devharness.openai_client import RETRY_OVER_HTTP, OpenAIClient
from devharness.testbed import Testbed, metric
from devharness.waiting import eventually
from loraplane.api import AgentOut
from loraplane.client import AsyncRegistryClient
from loraplane.events import ServedVersion
from tests.e2e.conftest import COMMON_SETTINGS
from tests.e2e.steps import (
    agent_report,
    direct,
    new_adapter,
    publish,
    served_by,
    vllm_models,
)

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def private_copy(source: Path, dest: Path, marker: str) -> Path:
    """``source`` with a config of its own: its blob is shared with no other version,
    so altering it in S3 breaks this version only."""
    shutil.copytree(source, dest)
    config = json.loads((dest / "adapter_config.json").read_text())
    config["revision"] = marker
    (dest / "adapter_config.json").write_text(json.dumps(config, indent=2))
    return dest


async def push_bad(testbed: Testbed, api: AsyncRegistryClient, name: str, case: str,
                   tmp_path: Path) -> int:
    """Push the bad version of ``case`` and point ``live`` at it; its number."""
    if case != "corrupt-blob":
        # The registry refuses another base model's shapes unless told; told, the agent
        # must still refuse them.
        return await publish(api, name, testbed.adapter_dir(case),
                             allow_shape_change=case == "other-base")
    folder = private_copy(testbed.adapter_dir("a3"), tmp_path / "corrupt", name)
    # Pushed without moving an alias, altered in S3, and only then made live: no agent
    # can have fetched the good bytes first.
    version = await publish(api, name, folder, aliases=())
    blob = sha256(folder / "adapter_config.json")
    original = (folder / "adapter_config.json").read_bytes()
    altered = original.replace(b'"r": 8', b'"r": 4')
    assert altered != original and len(altered) == len(original)
    testbed.blobs.overwrite(blob, altered)
    await api.move_alias(name, "live", version)
    return version


def failure_of(report: AgentOut | None, name: str, version: int) -> ServedVersion | None:
    if report is None:
        return None
    return next((f for f in report.status.failures
                 if f.adapter == name and f.version == version), None)


# A refusal is final at once; a download that does not match is tried max_attempts times
# (S3 might heal), then the version is marked bad here.
ATTEMPTS = int(COMMON_SETTINGS["max_attempts"])


@pytest.mark.parametrize(("case", "code", "says", "attempts"), [
    ("bad-rank", "rank_too_large", "rank 32", 1),
    ("other-base", "shape_mismatch", "base model's maps 128", 1),
    ("corrupt-blob", "fetch_failed", "sha256", ATTEMPTS),
])
async def test_bad_version_is_refused_and_the_good_one_keeps_serving(
        testbed: Testbed, api: AsyncRegistryClient, agent_a: OpenAIClient, vllm_a: OpenAIClient,
        unique: str, tmp_path: Path, case: str, code: str, says: str, attempts: int) -> None:
    name, vllm_url = f"bad-{case}-{unique}", testbed.vllms["a"].url
    good = f"{name}@1"
    await new_adapter(api, name, testbed.adapter_dir("a1"))
    reference = await direct(vllm_a, testbed.adapter_dir("a1"))
    await served_by(agent_a, name, good)

    loads_before = testbed.vllms["a"].load_requests()
    bad = await push_bad(testbed, api, name, case, tmp_path)
    bad_name = f"{name}@{bad}"

    async def reported() -> ServedVersion | None:
        return failure_of(await agent_report(api, "agent-a"), name, bad)

    failure = await eventually(reported, timeout_s=30, retrying=RETRY_OVER_HTTP,
                               what=f"agent-a reporting {bad_name}")
    assert failure.code == code and failure.state == "failed", failure
    assert failure.reason is not None and says in failure.reason, failure

    # Still the good version, with the good weights; vLLM never saw the bad one.
    for model in (name, f"{name}@live"):
        still = await agent_a.complete(model)
        assert (still.adapter, still.text) == (good, reference.text)
    models = await vllm_models(vllm_url)
    assert good in models and bad_name not in models
    assert testbed.vllms["a"].load_requests() == loads_before

    rollout = await api.rollout(name)
    live = next(a for a in rollout.aliases if a.alias == "live")
    assert live.version == bad and not live.converged, live
    assert any(e.agent_id == "agent-a" and e.version == bad and e.code == code
               for e in live.failed), live
    assert any(e.agent_id == "agent-a" and e.version == 1 and e.state == "serving"
               for e in live.serving), live

    metrics = testbed.agents["a"].metrics()
    # Each failed attempt counted once, not once per layer it went through.
    assert metric(metrics, "loraplane_agent_failures_total", adapter=name) == attempts
