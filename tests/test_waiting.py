"""``devharness.waiting.eventually``: the answer, sync or async checks, and its failures."""

from __future__ import annotations

import pytest

from devharness.waiting import Unexpected, eventually


async def test_returns_the_first_answer_that_is_not_none_or_false() -> None:
    answers = iter([None, False, 0, "late"])
    assert await eventually(lambda: next(answers)) == 0

    calls: list[int] = []

    async def check() -> str | None:
        calls.append(1)
        return "ready" if len(calls) == 3 else None

    assert await eventually(check) == "ready"
    assert len(calls) == 3


async def test_a_timeout_names_what_was_awaited_and_the_last_answer() -> None:
    with pytest.raises(AssertionError, match=r"the flag: not reached within 0.05s .*False"):
        await eventually(lambda: False, timeout_s=0.05, what="the flag")


async def test_exceptions_fail_at_once_unless_retried() -> None:
    def broken() -> bool:
        raise KeyError("missing")

    with pytest.raises(KeyError):
        await eventually(broken)
    with pytest.raises(AssertionError, match="KeyError"):
        await eventually(broken, timeout_s=0.05, retrying=(KeyError,))

    def wrong() -> bool:
        raise Unexpected("a wrong answer")

    with pytest.raises(Unexpected):
        await eventually(wrong, retrying=(AssertionError,))
