"""The short version of ``bench/blob_gc.py``: two small histories, each with its blob
store and orphans, one collector pass each through the real registry; it checks the
pass deleted exactly the orphans (the store counted afterwards), the memory and lag
figures were read and the commit recorded, never how fast or how big anything is."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.blob_gc import main


def test_one_pass_at_two_sizes_deletes_exactly_the_orphans(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "result.json"
    document = main(["--versions", "1000", "2000", "--adapters", "5", "--orphans", "150",
                     "--json-out", str(out)])
    assert json.loads(out.read_text()) == document
    assert [r["versions"] for r in document["results"]] == [1000, 2000]
    for result in document["results"]:
        versions = result["versions"]
        assert result["referenced_files"] == 2 * versions and result["orphan_files"] == 150
        assert result["report"]["examined"] == 2 * versions + 150
        assert result["report"]["deleted"] == 150
        assert result["census"] == {"referenced_present": 2 * versions,
                                    "referenced_missing": 0, "orphans_present": 0,
                                    "other_files": 0}
        assert result["exact"] is True
        assert 0 < result["rss_before_mib"] <= result["rss_peak_mib"]
        assert result["loop_lag"]["ticks"] > 0 and result["stalls"]["count"] >= 0
    assert document["memory"]["peak_ratio"] > 0
    assert len(document["commit"]) == 40
    printed = capsys.readouterr().out
    assert "peak RSS at 2,000 versions / at 1,000: " in printed
    assert f"commit {document['commit']}" in printed


def test_too_few_versions_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--versions", "3", "--adapters", "5"])
    assert exited.value.code == 2
    assert "error: --" in capsys.readouterr().err
