"""Runs each fuzz target for COUNT inputs and reports cases, time and findings.

Called by scripts/fuzz.sh (which installs atheris first). Each target runs in its own
process (libFuzzer ends the process it runs in) on a fresh corpus seeded with valid
files, under an address-space cap and libFuzzer's RSS and per-input time limits. A
finding is saved as FINDINGS/<target>/crash-* (or oom-*, timeout-*), next to the
target's full log, and makes the exit status 1.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from scripts.fuzz_inputs import archive_seeds, dictionary_file, safetensors_seeds

REPO = Path(__file__).resolve().parents[1]
_FINDING = re.compile(r"^(crash|oom|timeout|leak)-")
_EXECUTED = re.compile(r"stat::number_of_executed_units:\s*(\d+)")
# libFuzzer's progress lines ("#20696 REDUCE cov: ..."), for a run that died before its stats.
_PROGRESS = re.compile(r"^#(\d+)\s", re.MULTILINE)


@dataclass(frozen=True)
class Outcome:
    target: str
    cases: int
    seconds: float
    findings: list[Path]
    exit_code: int
    log: Path

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.findings


def _options() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="scripts/fuzz.sh", description=__doc__)
    parser.add_argument("count", nargs="?", type=int, default=100_000,
                        help="inputs per target (default 100000)")
    parser.add_argument("--targets", default="safetensors,archive",
                        help="comma-separated: safetensors, archive, canary (a planted bug)")
    parser.add_argument("--findings", type=Path, default=REPO / "fuzz-findings")
    parser.add_argument("--seed", type=int, default=None, help="libFuzzer's seed (random)")
    parser.add_argument("--rss-mb", type=int, default=1024, help="libFuzzer RSS limit")
    parser.add_argument("--timeout", type=int, default=20, help="seconds per input")
    return parser.parse_args()  # fmt: skip


def _seed_folder(target: str, folder: Path) -> int:
    seeds = archive_seeds() if target == "archive" else safetensors_seeds()
    folder.mkdir()
    for name, data in seeds.items():
        (folder / name).write_bytes(data)
    return max(len(data) for data in seeds.values())


def run_target(target: str, count: int, seed: int, options: argparse.Namespace) -> Outcome:
    findings = options.findings.resolve() / target
    findings.mkdir(parents=True, exist_ok=True)
    before = set(findings.iterdir())
    log = options.findings.resolve() / f"{target}.log"
    # Memory-backed when there is one: the archive target creates and removes files per case.
    shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    with tempfile.TemporaryDirectory(prefix=f"loraplane-fuzz-{target}-", dir=shm) as scratch:
        root = Path(scratch)
        largest = _seed_folder(target, root / "seeds")
        (root / "corpus").mkdir()
        dictionary = dictionary_file("archive" if target == "archive" else "safetensors",
                                     root / "tokens.dict")  # fmt: skip
        command = [sys.executable, "-m", "scripts.fuzz_targets", target, f"-runs={count}",
                   f"-seed={seed}", f"-rss_limit_mb={options.rss_mb}",
                   f"-timeout={options.timeout}", f"-max_len={max(2 * largest, 4096)}",
                   f"-dict={dictionary}", f"-artifact_prefix={findings}/",
                   "-print_final_stats=1", str(root / "corpus"), str(root / "seeds")]  # fmt: skip
        env = {**os.environ, "TMPDIR": scratch, "PYTHONPATH": str(REPO),
               "OPENBLAS_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}  # fmt: skip
        started = time.monotonic()
        with log.open("w") as out:
            result = subprocess.run(command, cwd=REPO, env=env, stdout=out,
                                    stderr=subprocess.STDOUT, check=False)  # fmt: skip
        seconds = time.monotonic() - started
    text = log.read_text(errors="replace")
    executed = _EXECUTED.findall(text) or _PROGRESS.findall(text)
    new = sorted(p for p in set(findings.iterdir()) - before if _FINDING.match(p.name))
    return Outcome(target, int(executed[-1]) if executed else 0, seconds, new,
                   result.returncode, log)  # fmt: skip


def _report(outcome: Outcome) -> None:
    print(f"{outcome.target}: {outcome.cases} cases in {outcome.seconds:.0f} s, "
          f"{len(outcome.findings)} findings (exit {outcome.exit_code}, log {outcome.log})")
    for finding in outcome.findings:
        print(f"  finding: {finding}")
    if outcome.exit_code != 0 and not outcome.findings:
        print("  the fuzzer itself failed (no input saved): see the log")
    if not outcome.ok:
        tail = outcome.log.read_text(errors="replace").splitlines()[-25:]
        print("\n".join("  | " + line for line in tail))
        print(f"  replay: .venv/bin/python -m scripts.fuzz_targets {outcome.target} FILE")


def main() -> int:
    options = _options()
    seed = options.seed if options.seed is not None else random.randrange(1, 2**31)
    targets = [t for t in options.targets.split(",") if t]
    print(f"fuzz: {options.count} inputs per target, seed {seed}, targets {', '.join(targets)}")
    failed = False
    for target in targets:
        outcome = run_target(target, options.count, seed, options)
        _report(outcome)
        failed |= not outcome.ok or outcome.cases < options.count
    total = "FINDINGS" if failed else "no findings"
    print(f"fuzz: {total}; inputs and logs under {options.findings}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
