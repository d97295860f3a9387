"""bench/haltpoll.py against a folder laid out as the kernel's haltpoll parameters,
and bench/proxy_cpu.py's rounds alternating the machine's setting and polling."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from bench import proxy_cpu
from bench.haltpoll import HaltPoll, HaltPollUnavailable

FOUND = {"guest_halt_poll_ns": "0", "guest_halt_poll_grow_start": "50000",
         "guest_halt_poll_allow_shrink": "Y", "guest_halt_poll_grow": "2"}


def parameters(tmp_path: Path) -> Path:
    for key, value in FOUND.items():
        (tmp_path / key).write_text(value + "\n")
    return tmp_path


def read(folder: Path) -> dict[str, str]:
    return {key: (folder / key).read_text().strip() for key in FOUND}


def test_polling_is_set_and_what_was_found_put_back(tmp_path: Path) -> None:
    folder = parameters(tmp_path)
    with HaltPoll(folder).restored() as halt:
        halt.poll(10_000_000)
        assert read(folder) == {**FOUND, "guest_halt_poll_ns": "10000000",
                                "guest_halt_poll_grow_start": "10000000",
                                "guest_halt_poll_allow_shrink": "N"}
    assert read(folder) == FOUND


def test_put_back_when_the_block_fails(tmp_path: Path) -> None:
    folder = parameters(tmp_path)
    with pytest.raises(RuntimeError, match="mid-run"), HaltPoll(folder).restored() as halt:
        halt.poll(5)
        raise RuntimeError("mid-run")
    assert read(folder) == FOUND


def test_a_machine_without_the_parameters_is_refused(tmp_path: Path) -> None:
    with pytest.raises(HaltPollUnavailable, match="no haltpoll parameters"):
        HaltPoll(tmp_path / "missing")
    folder = parameters(tmp_path)
    # Readable but not writable, even by root: refused before anything is changed.
    (folder / "guest_halt_poll_allow_shrink").unlink()
    (folder / "guest_halt_poll_allow_shrink").symlink_to("/proc/version")
    with pytest.raises(HaltPollUnavailable, match="cannot write"):
        HaltPoll(folder)


def test_each_round_runs_as_found_and_polling_in_turn(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch
                                                      ) -> None:
    folder = parameters(tmp_path)
    seen: list[tuple[str, str]] = []

    async def requests(url: str, count: int, pid: int) -> tuple[float, float]:
        seen.append((url, (folder / "guest_halt_poll_ns").read_text().strip()))
        return 0.001, 0.002

    monkeypatch.setattr(proxy_cpu, "_timed_requests", requests)
    args = argparse.Namespace(rounds=2, requests=1, guest_halt_poll_ns=7)
    urls = {"proxy": ("http://p", 1), "relay": ("http://r", 2)}
    with HaltPoll(folder).restored() as halt:
        measured = proxy_cpu._rounds(args, urls, halt)
    assert seen == [("http://p", "0"), ("http://r", "0"), ("http://p", "7"),
                    ("http://r", "7"),  # round 2: the other way round, both ways
                    ("http://r", "7"), ("http://p", "7"), ("http://r", "0"),
                    ("http://p", "0")]
    assert measured == {name: [(0.001, 0.002)] * 2
                        for name in ("proxy", "relay", "proxy, polling", "relay, polling")}
    assert read(folder) == FOUND
