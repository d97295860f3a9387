"""``--watch-dir`` without a registry: a folder change is swapped in like a new version."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest

from devharness.openai_client import RETRY_OVER_HTTP, OpenAIClient
from devharness.testbed import E2E_TENANT, Testbed, metric
from devharness.waiting import eventually
from loraplane.client import ADAPTER_FILES
from tests.e2e.conftest import AgentVariant
from tests.e2e.steps import direct, served_by, vllm_models

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]


def put_adapter(source: Path, folder: Path, staging: Path) -> None:
    """Replace ``folder``'s adapter files with ``source``'s, each in one atomic rename,
    as a careful deploy script would."""
    folder.mkdir(exist_ok=True)
    staging.mkdir(exist_ok=True)
    for name in ADAPTER_FILES:
        shutil.copyfile(source / name, staging / name)
        os.replace(staging / name, folder / name)


async def test_folder_changes_are_swapped_in_and_a_bad_one_is_refused(
        testbed: Testbed, agent_b: OpenAIClient, agent_b_variant: AgentVariant, unique: str,
        tmp_path: Path) -> None:
    name, vllm_url = f"local-{unique}", testbed.vllms["b"].url
    watch, staging = tmp_path / "watch", tmp_path / "staging"
    watch.mkdir()
    async with OpenAIClient(vllm_url) as vllm_b:
        texts = {f: (await direct(vllm_b, testbed.adapter_dir(f))).text for f in ("a1", "a2")}
    # Without a registry the agent takes inference credentials from a keys file, and
    # the watched adapters belong to the tenant it names: the test client's.
    keys = tmp_path / "keys"
    digest = hashlib.sha256(testbed.inference_token.encode()).hexdigest()
    keys.write_text(f"# tenant sha256\n{E2E_TENANT} {digest}\n")
    spec = testbed.agents["b"].variant(
        agent_id="agent-local", registry=None, token=None, nats_url=None, watch_dir=watch,
        cache_dir=tmp_path / "cache",
        settings={"KEYS_FILE": str(keys), "WATCH_TENANT": E2E_TENANT})
    agent_b_variant.restart(spec)

    put_adapter(testbed.adapter_dir("a1"), watch / name, staging)
    first = await served_by(agent_b, name, f"{name}@1", timeout_s=30)
    assert first.text == texts["a1"]

    put_adapter(testbed.adapter_dir("a2"), watch / name, staging)
    second = await served_by(agent_b, name, f"{name}@2", timeout_s=30)
    assert second.text == texts["a2"]

    async def v1_gone() -> bool:
        names = await vllm_models(vllm_url)
        return f"{name}@1" not in names and f"{name}@2" in names

    await eventually(v1_gone, timeout_s=15, retrying=RETRY_OVER_HTTP,
                     what=f"{name}@1 drained and unloaded")

    # Files vLLM must not get: refused with the reason, and @2 keeps serving.
    put_adapter(testbed.adapter_dir("bad-rank"), watch / name, staging)

    async def refused() -> bool:
        text = testbed.agents["b"].metrics()
        return metric(text, "loraplane_agent_failures_total", adapter=name,
                      code="rank_too_large") >= 1

    await eventually(refused, timeout_s=30, retrying=RETRY_OVER_HTTP,
                     what="the rank-32 folder refused")
    still = await agent_b.complete(name)
    assert (still.adapter, still.text) == (f"{name}@2", texts["a2"])
    assert not any(n.startswith(f"{name}@3") for n in await vllm_models(vllm_url))
