"""Fake wheels and an offline downloader: the device tests need no network."""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Dict, Sequence

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version


def fake_wheel(folder: Path, name: str, version: str, requires: Sequence[str] = (), pad: int = 0) -> Path:
    """A wheel with METADATA naming ``requires`` (and ``pad`` bytes of payload, stored uncompressed)."""
    folder.mkdir(parents=True, exist_ok=True)
    dist = name.replace("-", "_")
    path = folder / f"{dist}-{version}-py3-none-any.whl"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires
    )
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{dist}-{version}.dist-info/METADATA", meta)
        zf.writestr(f"{dist}/__init__.py", "")
        if pad:
            zf.writestr(f"{dist}/payload.bin", b"\0" * pad, compress_type=zipfile.ZIP_STORED)
    return path


class Index:
    """An offline wheel source: ``download(requirement, folder)`` copies the newest fitting wheel; ``asked`` is
    every requirement downloaded, in order."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.asked: list = []

    def download(self, requirement: str, folder: Path) -> Path:
        req = Requirement(requirement)
        self.asked.append(requirement)
        found: Dict[Version, Path] = {}
        for path in self.folder.glob("*.whl"):
            name, version, *_ = parse_wheel_filename(path.name)
            if name == canonicalize_name(req.name) and req.specifier.contains(version, prereleases=True):
                found[version] = path
        if not found:
            raise LookupError(f"no wheel for {requirement}")
        best = found[max(found)]
        target = folder / best.name
        target.write_bytes(best.read_bytes())
        return target
