"""Which files an adapter is made of, which are dropped and which are refused.

One rule for every way an adapter arrives (a folder the client reads, a zip or tar.gz
the registry unpacks, multipart parts, a watched folder): the client and the registry
both judge names with :func:`list_adapter_files` / :func:`check_names`.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from loraplane.lora.errors import AdapterInvalid

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
ALLOWED_FILES = (CONFIG_FILE, WEIGHTS_FILE)
# Written next to an adapter by save_pretrained (its model card) or by a trainer that
# saves the tokenizer too; harmless, never part of a version, so dropped everywhere.
IGNORED_FILES = frozenset({
    "README.md",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer.model",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "chat_template.jinja",
})
PICKLE_FILES = frozenset({"adapter_model.bin", "adapter_model.pt", "pytorch_model.bin"})
RESAVE_HINT = (f"re-save the adapter with model.save_pretrained(path, safe_serialization=True) "
               f"(the default in recent PEFT), which writes {WEIGHTS_FILE}")


def list_adapter_files(directory: Path) -> tuple[str, ...]:
    """The adapter files of ``directory``; ignored files pass, anything else is refused."""
    present: list[str] = []
    unknown: list[str] = []
    with os.scandir(directory) as entries:
        for entry in entries:
            mode = entry.stat(follow_symlinks=False).st_mode
            if entry.name in ALLOWED_FILES and stat.S_ISREG(mode):
                present.append(entry.name)
            elif entry.name in IGNORED_FILES and stat.S_ISREG(mode):
                continue
            else:
                unknown.append(entry.name + ("/" if stat.S_ISDIR(mode) else ""))
    return check_names(sorted(present), sorted(unknown))


def check_names(present: list[str], unknown: list[str]) -> tuple[str, ...]:
    """Refuse unknown files, then a missing config or weights file."""
    if unknown:
        raise AdapterInvalid(
            "unknown_file",
            _unknown_message(unknown),
            {"files": unknown, "allowed": list(ALLOWED_FILES),
             "ignored": sorted(IGNORED_FILES)},
        )
    if CONFIG_FILE not in present:
        raise AdapterInvalid("missing_config", f"{CONFIG_FILE} is missing", {"file": CONFIG_FILE})
    if WEIGHTS_FILE not in present:
        raise AdapterInvalid(
            "missing_weights", f"{WEIGHTS_FILE} is missing", {"file": WEIGHTS_FILE}
        )
    return tuple(present)


def _unknown_message(unknown: list[str]) -> str:
    pickles = [name for name in unknown if name in PICKLE_FILES]
    if pickles:
        # Pickle files can run code when loaded; only safetensors is accepted.
        return f"{', '.join(pickles)}: pickle weights are not accepted; {RESAVE_HINT}"
    return (
        f"unexpected files {', '.join(unknown)}; an adapter holds only "
        f"{' and '.join(ALLOWED_FILES)} (as regular files); README.md and tokenizer "
        "files are dropped"
    )


def drop_ignored_files(paths: list[Path]) -> list[Path]:
    """Delete the files :data:`IGNORED_FILES` names (a ``README.md``) and return the rest."""
    kept = []
    for path in paths:
        if path.name in IGNORED_FILES and path.is_file() and not path.is_symlink():
            path.unlink()
        else:
            kept.append(path)
    return kept
