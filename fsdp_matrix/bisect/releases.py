"""Candidate releases of a package between two versions, read from the indexes the installer is configured with.

Why the Simple API and not a tool's listing: the candidates must be exactly what the installer (uv, given the
user's pip configuration by ``envs.uv_environment``) can install, yanked releases left out.
- ``pip index versions`` honours pip's configuration, but it lists yanked releases without marking them (it reads
  every file, yanked or not), its output is text from a command pip marks experimental, and it needs pip in the env.
- uv has no listing command, and ``uv pip compile`` answers one resolution, not the list of releases.
- The Simple API (PEP 503 HTML, PEP 691 JSON) is the standard every index serves; it carries yanked status
  (PEP 592), Requires-Python and, in JSON, upload times (PEP 700). ``packaging`` parses the file names and
  versions. So this module reads the same index URLs and find-links uv is given and filters like an installer.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from datetime import datetime
from typing import Dict, Iterable, List, Mapping, Optional, Sequence

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.tags import Tag, compatible_tags, cpython_tags, sys_tags
from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

from fsdp_matrix.envs.config import Locations, configured_locations
from fsdp_matrix.envs.simple import DistFile, list_files
from fsdp_matrix.errors import EnvError


@dataclass
class Release:
    """One version of a package and the files that provide it."""

    version: Version
    files: List[DistFile] = field(default_factory=list)

    @property
    def upload_time(self) -> Optional[datetime]:
        times = [f.upload_time for f in self.files if f.upload_time]
        return min(times) if times else None


def _file_version(filename: str, project: str, tags: Optional[frozenset]) -> Optional[Version]:
    """The file's version if it is a distribution of ``project`` an installer here could use."""
    try:
        if filename.endswith(".whl"):
            wname, version, _, wtags = parse_wheel_filename(filename)
            if wname != project or (tags is not None and not (wtags & tags)):
                return None
            return version
        sname, version = parse_sdist_filename(filename)
        return version if sname == project else None
    except (InvalidWheelFilename, InvalidSdistFilename, InvalidVersion):
        return None


def _python_ok(requires: Optional[str], python: Version) -> bool:
    try:
        return not requires or SpecifierSet(requires).contains(python, prereleases=True)
    except InvalidSpecifier:
        return True


def releases(
    name: str, files: Iterable[DistFile], python: Optional[str] = None, tags: Optional[Iterable[Tag]] = None
) -> Dict[Version, Release]:
    """Installable releases by public version (``2.13.0+cpu`` counts as ``2.13.0``); yanked files are left out."""
    project = canonicalize_name(name)
    py = Version(python or ".".join(map(str, sys.version_info[:3])))
    tagset = frozenset(tags if tags is not None else sys_tags())
    out: Dict[Version, Release] = {}
    for f in files:
        version = _file_version(f.filename, project, tagset)
        if version is None or f.yanked or not _python_ok(f.requires_python, py):
            continue
        key = Version(version.public)
        out.setdefault(key, Release(key)).files.append(f)
    return out


def candidates_between(
    name: str, old: str, new: str, available: Mapping[Version, Release], pre: bool = False
) -> List[str]:
    """Releases from ``old`` to ``new`` inclusive, oldest first; pre-releases only with ``pre`` (or when an end)."""
    lo, hi = Version(Version(old).public), Version(Version(new).public)
    if lo > hi:
        raise EnvError(f"{name}: --old {old} is newer than --new {new}")
    for end in (lo, hi):
        if end not in available:
            near = ", ".join(str(v) for v in sorted(available)[-8:])
            raise EnvError(
                f"{name} {end} is not an installable release on the configured indexes: absent, yanked or not for "
                f"this Python (newest: {near})"
            )
    picked = [v for v in sorted(available) if lo <= v <= hi and (pre or not v.is_prerelease or v in (lo, hi))]
    return [str(v) for v in picked]


def release_candidates(
    name: str, old: str, new: str, pre: bool = False, locations: Optional[Locations] = None
) -> List[str]:
    """The candidate releases between old and new on the configured indexes."""
    files = list_files(name, locations or configured_locations())
    return candidates_between(name, old, new, releases(name, files), pre)


def _tags_for(python: Optional[str]) -> Optional[List[Tag]]:
    """Wheel tags an installer for ``python`` (``3.11``) on this platform accepts; None means this interpreter's."""
    if not python or tuple(int(p) for p in python.split(".")[:2]) == sys.version_info[:2]:
        return None
    version = tuple(int(p) for p in python.split(".")[:2])
    return list(cpython_tags(version)) + list(compatible_tags(version))


def newest_versions(
    names: Sequence[str], pre: bool = False, python: Optional[str] = None, locations: Optional[Locations] = None
) -> Dict[str, str]:
    """The newest installable release of each package on the configured indexes (yanked left out; pre-releases
    only with ``pre``), for ``python`` (default: this interpreter). What a floating combo such as ``newest`` pins."""
    locations = locations or configured_locations()
    tags = _tags_for(python)
    out: Dict[str, str] = {}
    for name in names:
        available = releases(name, list_files(name, locations), python, tags)
        picked = [v for v in available if pre or not v.is_prerelease]
        if not picked:
            raise EnvError(f"{name}: no installable release on the configured indexes for Python {python or 'here'}")
        out[name] = str(max(picked))
    return out
