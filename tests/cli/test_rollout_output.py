"""``loraplane rollout`` says why an alias has not converged, e.g. with no agents."""

from __future__ import annotations

import pytest

from loraplane.api import AliasRollout, RolloutOut
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
