"""Derive a JSON schema from one version of a Kubernetes CRD, for manifests of that kind.

kubernetes-validate knows Kubernetes' own kinds only. For the custom resources of
deploy/kubernetes/ (the InferencePool, the HTTPRoute) the test validates against the
CRD's own ``openAPIV3Schema``, made into a JSON schema here and committed under
deploy/kubernetes/schemas/:

- descriptions are dropped (the schema stays small; the CRD is the documentation);
- every object that lists its properties refuses others (``additionalProperties:
  false``), as the API server's strict field validation (``kubectl apply``'s default)
  does, unless the CRD keeps unknown fields there;
- ``apiVersion`` and ``kind`` must be the CRD's.

What this cannot check: the CRD's CEL rules (``x-kubernetes-validations``), which only
an API server evaluates; they stay in the schema as inert keywords.

    .venv/bin/python scripts/crd_schema.py CRD.yaml v1 OUT.json --source "repo@commit:path"
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import yaml


def _strict(node: Any) -> Any:
    if isinstance(node, list):
        return [_strict(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: _strict(value) for key, value in node.items() if key != "description"}
    if ("properties" in out and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


def crd_schema(crd: dict[str, Any], version: str, source: str) -> dict[str, Any]:
    """The JSON schema of ``version`` of ``crd`` (a CustomResourceDefinition)."""
    spec = crd["spec"]
    (served,) = [v for v in spec["versions"] if v["name"] == version]
    schema: dict[str, Any] = _strict(served["schema"]["openAPIV3Schema"])
    api_version = f"{spec['group']}/{version}"
    schema["properties"]["apiVersion"] = {"const": api_version}
    schema["properties"]["kind"] = {"const": spec["names"]["kind"]}
    schema["required"] = sorted({*schema.get("required", []), "apiVersion", "kind",
                                 "metadata"})
    return {"$schema": "http://json-schema.org/draft-07/schema#",
            "$comment": f"{api_version} {spec['names']['kind']}, derived by "
                        f"scripts/crd_schema.py from {source}",
            **schema}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("crd", type=Path)
    parser.add_argument("version")
    parser.add_argument("out", type=Path)
    parser.add_argument("--source", required=True,
                        help="where the CRD came from: repository, commit and path")
    args = parser.parse_args()
    crd = yaml.safe_load(args.crd.read_text())
    schema = crd_schema(crd, args.version, args.source)
    args.out.write_text(json.dumps(schema, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
