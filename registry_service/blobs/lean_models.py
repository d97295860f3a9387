"""A botocore session that keeps its S3 model in less memory.

botocore parses every model file (the S3 API, its endpoint rules, partitions) into
``OrderedDict``s, and keeps every ``documentation`` string of the API (most of the file)
for the life of the process. This session parses them into plain dicts, which keep their
order too, with the documentation emptied. Nothing at run time reads it: botocore only
renders it into docstrings, on demand.
Why: docs/decisions.md#the-s3-clients-models-drop-their-documentation

The loader is the one botocore makes (``create_loader``, with its search paths,
``AWS_DATA_PATH`` included, and its extras), registered the way botocore lets a
component be replaced; only the parse of each JSON file differs.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import IO, Any

import botocore.loaders
import botocore.session

# Keys that are documentation only, in the API model and in the endpoint rules.
_DOCUMENTATION = frozenset({"documentation", "documentationUrl"})


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # Emptied, not removed: botocore reads some of these keys with ``[]``.
    return {key: "" if key in _DOCUMENTATION else value for key, value in pairs}


class _LeanJSONFileLoader(botocore.loaders.JSONFileLoader):
    def _load_file(self, full_path: str, open_method: Callable[..., IO[bytes]]) -> Any:
        if not os.path.isfile(full_path):
            return None
        with open_method(full_path, "rb") as handle:
            payload = handle.read()
        # Dropped as they are parsed: freed at once, so never all held together.
        return json.loads(payload, object_pairs_hook=_object)


def lean_botocore_session() -> botocore.session.Session:
    """A new botocore session whose models have their documentation emptied."""
    session = botocore.session.get_session()
    # The loader botocore itself would make (its search paths, AWS_DATA_PATH's included).
    loader = botocore.loaders.create_loader(session.get_config_variable("data_path"))
    loader.file_loader = _LeanJSONFileLoader()
    session.register_component("data_loader", loader)
    return session
