"""Regular expressions from ``adapter_config.json``, matched in linear time.

A config's patterns (``target_modules`` or ``exclude_modules`` as a string,
``layers_pattern``, the keys of ``rank_pattern`` and ``alpha_pattern``) are the
publisher's. Python's backtracking ``re`` takes exponential time on patterns such
as ``l(.|.)*Z``, so every one of them is matched here with RE2, whose time is linear
in the name. Module paths and patterns are printable ASCII (the module paths are
checked in :mod:`loraplane.lora.tensors`), and the few constructs that RE2 and
Python read differently (``{,n}``, ``[:alpha:]``) are refused, so a pattern matches
exactly what Python's ``re`` (PEFT, vLLM) would match.

vLLM itself evaluates ``rank_pattern`` and ``alpha_pattern`` with Python's ``re``
for every module it loads, so their keys must also be safe for a backtracking
matcher: :func:`key_paths` admits only a grammar where a repetition follows one
character, and bounds the paths a backtracking matcher can try.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any

import re2

MAX_PATTERN_CHARS = 1024
# The longest module path an adapter may hold (real ones are under 100 characters).
MAX_MODULE_CHARS = 256
# The most paths a backtracking matcher may try for one rank/alpha key against one
# module name of MAX_MODULE_CHARS: one ``.*`` (257 paths) with a few alternatives.
MAX_KEY_PATHS = 2048
# Groups inside groups in one rank/alpha key.
MAX_KEY_DEPTH = 16

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False
# RE2's memory per pattern, its lazily built DFA included (8 MiB by default): a pattern
# of MAX_PATTERN_CHARS compiles in it, and a DFA that outgrows it falls back to the NFA,
# still linear. Bounds what the cache of compiled patterns below can hold.
_OPTIONS.max_mem = 1 << 18


class PatternError(ValueError):
    """A pattern is refused; ``str(error)`` says why, for people."""


@dataclass(frozen=True, slots=True)
class Pattern:
    """One compiled pattern; every method is linear in the text."""

    source: str
    _re2: Any

    def match(self, text: str) -> bool:
        return self._re2.match(text) is not None

    def fullmatch(self, text: str) -> bool:
        return self._re2.fullmatch(text) is not None

    def match_group(self, text: str, group: str) -> str | None:
        """The named group of a match at the start of ``text``, None without a match."""
        found = self._re2.match(text)
        if found is None:
            return None
        value = found.group(group)
        return value if isinstance(value, str) else None


def is_printable_ascii(text: str) -> bool:
    return text.isascii() and text.isprintable()


@functools.lru_cache(maxsize=8192)
def compile_pattern(source: str) -> Pattern:
    """Compile ``source`` for RE2; raise :class:`PatternError` when refused.

    The pattern must also compile in Python (what PEFT and vLLM use), and is refused
    where the two engines would read it differently.
    """
    if len(source) > MAX_PATTERN_CHARS:
        raise PatternError(f"the pattern is longer than {MAX_PATTERN_CHARS} characters")
    if not is_printable_ascii(source):
        raise PatternError("the pattern holds characters other than printable ASCII")
    for construct, why in (("{,", "{,n} (write {0,n})"), ("[:", "a POSIX class [:name:]")):
        if construct in source:
            raise PatternError(f"the pattern uses {why}, which RE2 and Python read differently")
    try:
        re.compile(source)
    except re.error as exc:
        raise PatternError(f"not a valid regular expression: {exc}") from None
    except RecursionError:
        raise PatternError("the pattern's groups are nested too deeply") from None
    try:
        compiled = re2.compile(source, _OPTIONS)
    except re2.error as exc:
        reason = exc.args[0] if exc.args else ""
        reason = reason.decode(errors="replace") if isinstance(reason, bytes) else str(reason)
        raise PatternError(
            "the pattern uses a construct the linear-time matcher (RE2) does not support, "
            f"such as a back-reference or a look-around: {reason}"
        ) from None
    return Pattern(source, compiled)


def rank_key_source(key: str) -> str:
    """PEFT's ``get_pattern_key`` test for one key: a dot-bounded suffix of the name."""
    return rf"(.*\.)?({key})$"


def layers_pattern_source(item: str) -> str:
    """PEFT's layer-index test for one ``layers_pattern`` entry (group ``idx``)."""
    return rf"(?:^|.*?\.){item}\.(?P<idx>\d+)\."


@functools.lru_cache(maxsize=8192)
def key_paths(key: str, max_chars: int = MAX_MODULE_CHARS) -> int:
    """The most paths a backtracking matcher can try for ``key`` on one suffix of a name.

    Raises :class:`PatternError` when the key is outside the admitted grammar or could
    take more than :data:`MAX_KEY_PATHS` paths.
    """
    paths = _KeyParser(key, max_chars).parse()
    if paths > MAX_KEY_PATHS:
        raise PatternError(
            f"a backtracking matcher (vLLM's) could try more than {MAX_KEY_PATHS} ways to "
            "match this pattern against one module name; use fewer repetitions (*, +, ?, "
            "{m,n}) and alternatives"
        )
    return paths


_SINGLE_ESCAPES = frozenset("dDwWsS")
_QUANTIFIER_START = frozenset("*+?{")
_UNBOUNDED = -1


class _KeyParser:
    """Recursive descent over the admitted grammar of a rank/alpha key.

    ``pattern := seq ('|' seq)*``; ``seq := (atom quantifier?)*``; an atom is a
    printable character, ``.``, an escape (``\\.``, ``\\d``, ...), a ``[class]``, an
    anchor ``^``/``$`` or a group ``(...)``/``(?:...)``. ``*``, ``+`` and ``{m,n}``
    follow only an atom that matches one character; a group takes at most ``?``.
    The count of paths multiplies along a sequence and adds over alternatives.
    """

    def __init__(self, text: str, max_chars: int) -> None:
        self.text = text
        self.pos = 0
        self.depth = 0
        self.max_chars = max_chars
        # Past this the exact count no longer matters; keeps the numbers small.
        self.cap = MAX_KEY_PATHS + 1

    def fail(self, message: str) -> PatternError:
        return PatternError(f"{message} (at character {self.pos + 1})")

    def peek(self) -> str | None:
        return self.text[self.pos] if self.pos < len(self.text) else None

    def parse(self) -> int:
        if not is_printable_ascii(self.text):
            raise PatternError("the pattern holds characters other than printable ASCII")
        paths = self.alternatives()
        if self.pos != len(self.text):
            raise self.fail("unbalanced ')'")
        return paths

    def alternatives(self) -> int:
        total = self.sequence()
        while self.peek() == "|":
            self.pos += 1
            total = min(self.cap, total + self.sequence())
        return total

    def sequence(self) -> int:
        paths = 1
        while (char := self.peek()) is not None and char not in "|)":
            atom_paths, single = self.atom()
            paths = min(self.cap, paths * self.quantified(atom_paths, single))
        return paths

    def atom(self) -> tuple[int, bool | None]:
        """Paths of the atom and whether it matches one character (None: an anchor)."""
        char = self.text[self.pos]
        if char == "(":
            return self.group(), False
        if char == "[":
            self.char_class()
            return 1, True
        if char == "\\":
            self.escape()
            return 1, True
        if char in "^$":
            self.pos += 1
            return 1, None
        if char in _QUANTIFIER_START:
            raise self.fail(f"{char!r} repeats nothing")
        if char in "]}":
            raise self.fail(f"write a literal {char!r} as '\\{char}'")
        self.pos += 1  # "." or a literal character
        return 1, True

    def group(self) -> int:
        self.pos += 1
        self.depth += 1
        if self.depth > MAX_KEY_DEPTH:
            raise self.fail(f"groups are nested more than {MAX_KEY_DEPTH} deep")
        if self.text.startswith("?:", self.pos):
            self.pos += 2
        elif self.peek() == "?":
            raise self.fail("only plain groups (...) and (?:...) are allowed, no flags, "
                            "names or look-arounds")
        paths = self.alternatives()
        if self.peek() != ")":
            raise self.fail("missing ')'")
        self.pos += 1
        self.depth -= 1
        return paths

    def char_class(self) -> None:
        self.pos += 1
        if self.peek() == "^":
            self.pos += 1
        if self.peek() == "]":
            raise self.fail("write a ']' in a class as '\\]'")
        while (char := self.peek()) != "]":
            if char is None:
                raise self.fail("missing ']'")
            if char == "[":
                raise self.fail("write a '[' in a class as '\\['")
            if char == "\\":
                self.escape()
            else:
                self.pos += 1
        self.pos += 1

    def escape(self) -> None:
        self.pos += 1
        char = self.peek()
        if char is None:
            raise self.fail("the pattern ends with '\\'")
        if char.isalnum() and char not in _SINGLE_ESCAPES:
            raise self.fail(f"the escape \\{char} is not allowed (only \\d \\D \\w \\W \\s "
                            "\\S and escaped punctuation such as \\.)")
        self.pos += 1

    def quantified(self, paths: int, single: bool | None) -> int:
        char = self.peek()
        if char is None or char not in _QUANTIFIER_START:
            return paths
        low, high = self.quantifier()
        if self.peek() == "?":
            self.pos += 1  # lazy: the same paths, in another order
        if (char := self.peek()) is not None and char in _QUANTIFIER_START:
            raise self.fail("a repetition of a repetition")
        if single is None:
            raise self.fail("an anchor cannot be repeated")
        if not single and (high == _UNBOUNDED or high > 1):
            raise self.fail(
                "*, + and {m,n} may only follow one character, '.', an escape such as \\d "
                "or a [class]: a repeated group can take exponential time in a backtracking "
                "matcher"
            )
        if single:
            top = self.max_chars if high == _UNBOUNDED else min(high, self.max_chars)
            return max(1, top - low + 1)
        if high == 0:
            return 1
        return paths if low == 1 else min(self.cap, paths + 1)

    def quantifier(self) -> tuple[int, int]:
        char = self.text[self.pos]
        self.pos += 1
        if char == "*":
            return 0, _UNBOUNDED
        if char == "+":
            return 1, _UNBOUNDED
        if char == "?":
            return 0, 1
        end = self.text.find("}", self.pos)
        match = re.fullmatch(r"(\d{1,4})(,(\d{0,4}))?", self.text[self.pos : end]) \
            if end >= 0 else None
        if match is None:
            raise self.fail("braces only as a repeat count {m}, {m,} or {m,n}; write a "
                            "literal brace as '\\{'")
        self.pos = end + 1
        low = int(match[1])
        if match[2] is None:
            return low, low
        high = int(match[3]) if match[3] else _UNBOUNDED
        if high != _UNBOUNDED and high < low:
            raise self.fail(f"the repeat count {{{low},{high}}} is backwards")
        return low, high
