"""What ``--py-spy`` of the proxy benchmarks prints, from a raw py-spy profile (py-spy
itself is not installed in CI; the summary is what broke unnoticed once)."""

from __future__ import annotations

from pathlib import Path

from bench.profiling import profile_summary


def test_the_summary_gives_each_functions_inclusive_share(tmp_path: Path) -> None:
    raw = tmp_path / "agent.txt"
    raw.write_text("thread (1);main (a.py:1);serve (b.py:2);send (c.py:3) 3\n"
                   "thread (1);main (a.py:1);serve (b.py:2) 1\n"
                   "\n")
    lines = profile_summary(raw).splitlines()
    assert lines[0] == "py-spy of the agent, 4 samples; inclusive share by function:"
    assert lines[1:] == ["  100.0%  main (a.py:1)", "  100.0%  serve (b.py:2)",
                         "   75.0%  send (c.py:3)"]
