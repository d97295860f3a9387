"""The registry's event-loop lag: its /metrics (uvicorn, real NATS) exports
loraplane_registry_event_loop_lag_seconds, a test that holds the registry's loop moves
it and is named in a warning; and its settings refuse bad values."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from devharness.services import NatsService
from registry_service.settings import RegistrySettings
from tests.agent.loop_support import served_registry
from tests.loop_lag_support import hold_and_see, names_the_hog

NAME = "loraplane_registry_event_loop_lag_seconds"


async def test_holding_the_registry_s_loop_moves_its_lag(tmp_path: Path,
                                                         nats: NatsService) -> None:
    async with served_registry(tmp_path, nats) as registry:
        # The registry serves from this test's loop: holding this task holds it.
        lines = await hold_and_see(registry.harness.client, NAME)
    # No frame of the registry's packages on the hog's stack: its innermost frame is named.
    assert names_the_hog(lines), lines


@pytest.mark.parametrize("values", [{"loop_lag_interval_s": 0}, {"loop_lag_warn_s": -1},
                                    {"loop_lag_interval_s": 0.5, "loop_lag_warn_s": 0.2},
                                    {"gil_switch_interval_s": 0},
                                    {"gil_switch_interval_s": 1.0}])
def test_bad_loop_lag_settings_are_refused(tmp_path: Path, values: dict[str, Any]) -> None:
    with pytest.raises(ValidationError, match=r"loop_lag|gil_switch_interval"):
        RegistrySettings(data_dir=tmp_path, **values)


def test_the_loop_lag_defaults() -> None:
    settings = RegistrySettings()
    assert (settings.loop_lag_interval_s, settings.loop_lag_warn_s) == (0.1, 0.1)
    assert settings.gil_switch_interval_s == 0.001
