"""The README's quickstart, run word for word as a new user would, in a sandbox.

Every shell block of the README is either run here (``<!-- run -->``, in order, each
exiting 0; ``<!-- background -->``, left running as in a second terminal) or names
the test that runs it (``<!-- covered: ... -->``); a block that is neither fails.
"""

from __future__ import annotations

import httpx

from tests.docs.doc_blocks import ROOT, Block, Sandbox, shell_blocks

README = ROOT / "README.md"


def test_every_readme_shell_block_is_run_or_covered() -> None:
    found = shell_blocks(README)
    assert found, "the README shows no shell block"
    for block in found:
        assert block.marker in ("run", "background", "covered"), (
            f"{block.where()}: a shell block no test runs; mark it <!-- run -->, "
            f"<!-- background --> or <!-- covered: the test that runs it -->")
        if block.marker == "covered":
            _check_covered(block)


def _check_covered(block: Block) -> None:
    """``<!-- covered: CMD by PATH; CMD by PATH -->``: each command names what runs it."""
    named: dict[str, str] = {}
    for part in block.note.lstrip(":").split(";"):
        command, _, runner = part.strip().rpartition(" by ")
        assert (ROOT / runner).is_file(), f"{block.where()}: {runner} does not exist"
        named[command] = runner
    commands = {line.split("#", 1)[0].strip() for line in block.code.splitlines()} - {""}
    assert commands == set(named), (
        f"{block.where()}: the comment names {sorted(named)}, the block runs {sorted(commands)}")


def test_the_quickstart_runs_as_written(sandbox: Sandbox) -> None:
    for block in shell_blocks(README):
        if block.marker == "run":
            done = sandbox.run(block)
            assert done.returncode == 0, (
                f"{block.where()} exited {done.returncode}:\n{block.code}\n"
                f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}")
        elif block.marker == "background":
            sandbox.start(block, f"{sandbox.registry_url}/healthz")
    _the_version_is_live_on_the_web_page(sandbox)


def _the_version_is_live_on_the_web_page(sandbox: Sandbox) -> None:
    token = (sandbox.home / ".loraplane" / "admin-token").read_text().strip()
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=sandbox.registry_url, headers=headers, timeout=30) as http:
        assert http.get("/ui").status_code == 200
        timeline = http.get("/ui/api/adapters/support-bot/timeline")
        adapter = http.get("/v1/adapters/support-bot").json()
    assert timeline.status_code == 200, timeline.text
    entries = timeline.json()["entries"]
    # Version 2 came with the canary of "Rolling out a new version safely", aborted:
    # `live` still serves version 1.
    assert sorted(e["version"] for e in entries if e["kind"] == "version") == [1, 2], entries
    assert [(a["alias"], a["version"]) for a in adapter["aliases"]] == [("live", 1)], adapter
    moves = [(e["alias"], e["action"], e["to_version"]) for e in entries if e["kind"] == "move"]
    assert ("live", "promote", 1) in moves and ("live", "canary_abort", 1) in moves, entries
