"""The agent's event-loop lag: its /metrics (a real agent in this loop, beside the vLLM
stand-in, serving a watched folder) exports loraplane_agent_event_loop_lag_seconds, a
test that holds the agent's loop moves it and is named in a warning; and its settings
refuse bad values."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from devharness.vllm_standin import StandIn, create_app
from inference_agent.settings import AgentSettings
from tests.agent.loop_support import running_agent, serve_app
from tests.agent.test_service import BASE, keys_file
from tests.loop_lag_support import hold_and_see, names_the_hog

NAME = "loraplane_agent_event_loop_lag_seconds"


def settings(tmp_path: Path, **values: Any) -> AgentSettings:
    watch = tmp_path / "watch"
    watch.mkdir(exist_ok=True)
    return AgentSettings(base_model=BASE, watch_dir=watch, cache_dir=tmp_path / "cache",
                         keys_file=keys_file(tmp_path), port=0, agent_id="lagging",
                         **values)


async def test_holding_the_agent_s_loop_moves_its_lag(tmp_path: Path) -> None:
    async with serve_app(create_app(StandIn(BASE))) as vllm_url, \
            running_agent(settings(tmp_path, vllm_url=vllm_url)) as agent, \
            httpx.AsyncClient(base_url=str(agent.url), timeout=60) as client:
        # The agent runs in this test's loop: holding this task holds it.
        lines = await hold_and_see(client, NAME)
    assert names_the_hog(lines), lines


@pytest.mark.parametrize("values", [{"loop_lag_interval_s": 0}, {"loop_lag_warn_s": -1},
                                    {"loop_lag_interval_s": 0.5, "loop_lag_warn_s": 0.2},
                                    {"gil_switch_interval_s": 0},
                                    {"gil_switch_interval_s": 1.0}])
def test_bad_loop_lag_settings_are_refused(tmp_path: Path, values: dict[str, Any]) -> None:
    with pytest.raises(ValidationError, match=r"loop_lag|gil_switch_interval"):
        settings(tmp_path, **values)


def test_the_loop_lag_defaults(tmp_path: Path) -> None:
    chosen = settings(tmp_path)
    assert (chosen.loop_lag_interval_s, chosen.loop_lag_warn_s) == (0.1, 0.1)
    assert chosen.gil_switch_interval_s == 0.001
