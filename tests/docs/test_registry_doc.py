"""docs/registry.md's command examples run as written, in order, on a fresh registry.

The page's ``<!-- run -->`` blocks make two adapters, push, promote and roll back,
then set and delete routing rules: each must exit 0, so an example that refers to
something an earlier one removed (an alias deleted before a rule names it) fails here.
"""

from __future__ import annotations

from tests.docs.doc_blocks import DOCS, Block, Sandbox, shell_blocks

PAGE = DOCS / "registry.md"


def _terminal(code: str) -> Block:
    return Block(PAGE, 0, "bash", "run", "set up by the test", code)


def test_the_command_examples_run_in_order(sandbox: Sandbox) -> None:
    examples = [b for b in shell_blocks(PAGE) if b.marker == "run"]
    assert len(examples) >= 3, "the page's runnable examples went missing"
    assert sandbox.run(_terminal("source .venv/bin/activate")).returncode == 0
    sandbox.start(_terminal("loraplane registry serve"), f"{sandbox.registry_url}/healthz")
    for block in examples:
        done = sandbox.run(block)
        assert done.returncode == 0, (
            f"{block.where()} exited {done.returncode}:\n{block.code}\n"
            f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}")
