"""What a killed registry leaves behind, removed at the next start.

A registry killed mid-upload leaves its upload's staging folder, and one killed while a
blob was written leaves a ``.tmp`` file beside the local blob store's blobs. Only what
this registry owns is swept: its own staging folder, and ``.tmp`` files of the local
blob folder old enough that no live writer can still be filling them.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from registry_service.blobs.walk_store import remove_stale_tmp

log = logging.getLogger(__name__)

# A blob write in flight renames its .tmp file within seconds; an hour is generous.
TMP_GRACE_S = 3600.0


def sweep_staging(staging_dir: Path) -> int:
    """Remove every upload folder left in staging; returns how many."""
    removed = 0
    for entry in staging_dir.iterdir() if staging_dir.is_dir() else ():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        removed += 1
    if removed:
        log.info("removed %d upload(s) left in %s by an earlier run", removed, staging_dir)
    return removed


def sweep_blob_tmp(blob_dir: Path, grace_s: float = TMP_GRACE_S) -> int:
    """Remove the local blob store's ``.tmp`` files older than ``grace_s``."""
    removed = remove_stale_tmp(str(blob_dir), grace_s)
    if removed:
        log.info("removed %d unfinished blob file(s) from %s", removed, blob_dir)
    return removed
