"""The short version of ``bench/route_resolve.py``: it runs and reports, never how fast."""

from __future__ import annotations

from pathlib import Path

from bench.route_resolve import main


def test_the_resolve_benchmark_times_every_form_at_every_size(tmp_path: Path) -> None:
    document = main(["--adapters", "1", "20", "--calls", "50", "--rounds", "2",
                     "--json-out", str(tmp_path / "out.json")])
    assert set(document["us_per_resolve"]) == {"1", "20"}
    for forms in document["us_per_resolve"].values():
        assert set(forms) == {"aN", "aN@live", "aN@1"}
        assert all(value >= 0 for value in forms.values())
    assert len(document["commit"]) == 40 and (tmp_path / "out.json").is_file()
