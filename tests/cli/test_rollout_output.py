"""``loraplane rollout`` says why an alias has not converged, e.g. with no agents."""

from __future__ import annotations

import pytest

from loraplane.api import AliasRollout, RolloutOut
from loraplane.api.agents import TierOut
from loraplane_cli.fleet import render_rollout
from loraplane_cli.output import Output


def test_a_rollout_with_no_agents_reads_not_converged(capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    live = AliasRollout(alias="live", version=3, revision=1, serving=[], failed=[],
                        pending=[], converged=False, reason="no agents")
    rollout = RolloutOut(adapter="bot", tenant="acme", base_model="m", deleted=False,
                         stale_after_s=60, agents=0, aliases=[live], unaliased=[])
    render_rollout(Output(), rollout)
    shown = capsys.readouterr().out
    assert "live: not converged (no agents)" in shown
    assert "yes" not in shown


def test_a_placement_says_where_the_adapter_is_over_capacity(
        capsys: pytest.CaptureFixture[str]) -> None:
    tiers = [TierOut(agent_id="gpu-1", version=1, tier="hot", owned=True, stale=False),
             TierOut(agent_id="gpu-2", version=1, tier="warm", owned=True,
                     over_capacity=True, stale=False),
             TierOut(agent_id="gpu-3", version=1, tier="warm", owned=True,
                     over_capacity=True, stale=True)]
    rollout = RolloutOut(adapter="bot", tenant="acme", base_model="m", deleted=False,
                         stale_after_s=60, agents=2, aliases=[], unaliased=[], replicas=2,
                         placed=["gpu-1", "gpu-2"], hot=["gpu-1"], tiers=tiers)
    render_rollout(Output(), rollout)
    shown = capsys.readouterr().out
    assert "placed on gpu-1, gpu-2; hot on gpu-1" in shown
    assert "over capacity (owned, loaded on demand) on gpu-2\n" in shown, shown
