"""docs/metrics.md lists every metric the agent and the registry declare."""

from __future__ import annotations

import re

from inference_agent.metrics import AgentMetrics
from registry_service.metrics import RegistryMetrics
from tests.deploy.promtool import ROOT


def exported_names() -> set[str]:
    """Names as /metrics shows them: counters with ``_total``."""
    names: set[str] = set()
    for registry in (AgentMetrics().registry, RegistryMetrics().registry):
        for family in registry.collect():
            names.add(family.name + ("_total" if family.type == "counter" else ""))
    return names


def test_every_metric_is_in_the_reference() -> None:
    text = (ROOT / "docs" / "metrics.md").read_text()
    documented = set()
    for prefix_heading, prefix in (("## The agent", "loraplane_agent_"),
                                   ("## The registry", "loraplane_registry_")):
        section = text.split(prefix_heading, 1)[1].split("\n## ", 1)[0]
        documented |= {prefix + name for name in re.findall(r"^\| `(\w+)` \|", section,
                                                              flags=re.MULTILINE)}
    assert documented == exported_names()
