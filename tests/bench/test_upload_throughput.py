"""The short version of ``bench/upload_throughput.py`` that CI runs, so a broken
benchmark is noticed. It checks what the benchmark reports, never how fast it was."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench.upload_throughput import DECLARED, RAW, UNDECLARED, WARM_UP, main


def test_the_upload_benchmark_runs_every_kind_and_reports_ratios_memory_and_commit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Unsigned on both sides: SeaweedFS over http:// takes unsigned parts too.
    document = main(["--size-mb", "8", "--repeat", "2", "--undeclared",
                     "--payload-signing", "off", "--warm-up-mb", "2",
                     "--work-dir", str(tmp_path), "--json-out", str(tmp_path / "out.json")])
    assert document is not None and document["payload_signing"] == "off"
    assert re.fullmatch(r"[0-9a-f]{40}", document["commit"]["commit"])
    samples = document["samples"]
    assert sorted((s["kind"], s["run"]) for s in samples) == sorted(
        [(WARM_UP, 0)] + [(kind, run) for kind in (RAW, DECLARED, UNDECLARED) for run in (1, 2)])
    summary = document["summary"]
    for kind in (DECLARED, UNDECLARED):
        ratio = summary[kind]["throughput_ratio_to_raw"]
        assert 0 < ratio["min"] <= ratio["median"] <= ratio["max"]
        assert len(summary[kind]["server_peak_rss_mib"]) == 2
    # The CPU of every process an upload costs: the S3 server's too, on both paths.
    assert all(s["s3_cpu_s"] is not None and s["s3_cpu_s"] >= 0 for s in samples)
    for kind in (RAW, DECLARED, UNDECLARED):
        cpu = summary[kind]["cpu_s"]
        assert cpu["total"] > 0 and cpu["s3"] is not None
        assert (cpu["registry"] is None) == (kind == RAW)
    assert summary[DECLARED]["cpu_ratio_to_raw"] > 0
    registry = [s for s in samples if s["kind"] != RAW]
    assert all(s["server_peak_rss_mib"] >= s["server_rss_before_mib"] > 0 for s in registry)
    assert len(summary["server_rss_before_each_upload_mib"]) == 4  # not the warm-up's
    warm = summary["warm_up"]
    assert 0 < warm["server_rss_before_mib"] <= warm["server_peak_rss_mib"]
    assert warm["size_bytes"] > 0
    printed = capsys.readouterr().out
    assert "throughput ratio to raw per round" in printed
    assert "warm-up upload" in printed
    assert "CPU per upload, registry (medians)" in printed and "raw's total over this" in printed
    assert document["commit"]["commit"] in printed
    assert (tmp_path / "out.json").is_file()
    # The scratch folder is gone: nothing is left behind.
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]
