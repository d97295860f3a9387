"""docs/metrics.md lists every metric the agent and the registry declare."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from prometheus_client import CollectorRegistry

from inference_agent.service import Agent
from inference_agent.settings import AgentSettings
from registry_service.app import create_app
from registry_service.settings import RegistrySettings
from tests.deploy.promtool import ROOT


def registries(tmp_path: Path) -> list[CollectorRegistry]:
    """The agent's and the registry's metrics as each service builds them: their metrics
    classes and what the service adds (the event-loop lag)."""
    watched, keys = tmp_path / "watch", tmp_path / "keys"
    watched.mkdir()
    keys.write_text(f"local {hashlib.sha256(b'secret').hexdigest()}\n")
    agent = Agent(AgentSettings(base_model="base", watch_dir=watched, keys_file=keys,
                                cache_dir=tmp_path / "cache"))
    app = create_app(RegistrySettings(data_dir=tmp_path / "registry"))
    return [agent.metrics.registry, app.state.metrics.registry]


def exported_names(tmp_path: Path) -> set[str]:
    """Names as /metrics shows them: counters with ``_total``."""
    names: set[str] = set()
    for registry in registries(tmp_path):
        for family in registry.collect():
            names.add(family.name + ("_total" if family.type == "counter" else ""))
    return names


def test_every_metric_is_in_the_reference(tmp_path: Path) -> None:
    text = (ROOT / "docs" / "metrics.md").read_text()
    documented = set()
    for prefix_heading, prefix in (("## The agent", "loraplane_agent_"),
                                   ("## The registry", "loraplane_registry_")):
        section = text.split(prefix_heading, 1)[1].split("\n## ", 1)[0]
        documented |= {prefix + name for name in re.findall(r"^\| `(\w+)` \|", section,
                                                              flags=re.MULTILINE)}
    assert documented == exported_names(tmp_path)
