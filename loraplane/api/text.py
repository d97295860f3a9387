"""Names people choose and others read: no characters that steer a terminal.

A token name holding ``ESC [ ... m`` or a bidi override (U+202E) would otherwise be
stored as given and reach an admin's terminal through ``loraplane token list`` or
``loraplane history``. The registry refuses such names (:data:`SafeName`); the CLI
also escapes whatever it prints (``loraplane_cli/output.py``), for data stored before.
"""

from __future__ import annotations

import unicodedata
from typing import Annotated

from pydantic import AfterValidator

# Control (Cc: C0, DEL, C1), format (Cf: bidi overrides and isolates, zero-width
# characters), lone surrogates (Cs) and the line/paragraph separators (Zl, Zp).
UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


def is_unsafe(char: str) -> bool:
    return unicodedata.category(char) in UNSAFE_CATEGORIES


def unsafe_characters(text: str) -> list[str]:
    """The distinct unsafe characters of ``text`` as ``U+XXXX``, in order of appearance."""
    found = dict.fromkeys(f"U+{ord(c):04X}" for c in text if is_unsafe(c))
    return list(found)


def check_safe_name(value: str) -> str:
    unsafe = unsafe_characters(value)
    if unsafe:
        raise ValueError(
            "must not hold control or formatting characters (found "
            f"{', '.join(unsafe[:5])})"
        )
    return value


SafeName = Annotated[str, AfterValidator(check_safe_name)]
