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

import base64
import json
import os
import re
import ssl
import sys
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime
from html.parser import HTMLParser
from pathlib import Path
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

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

from fsdp_matrix.envs import pip_config, uv_environment
from fsdp_matrix.errors import EnvError

PYPI = "https://pypi.org/simple"
_ACCEPT = "application/vnd.pypi.simple.v1+json, text/html;q=0.1"
_UV_VARS = ("UV_INDEX", "UV_INDEX_URL", "UV_DEFAULT_INDEX", "UV_EXTRA_INDEX_URL", "UV_FIND_LINKS")


@dataclass(frozen=True)
class Locations:
    """Where the installer looks for distributions."""

    indexes: Tuple[str, ...]
    """Simple API roots, the default index first."""
    find_links: Tuple[str, ...] = ()
    """Flat directories or HTML pages of distribution files."""
    cafile: Optional[str] = None
    """CA bundle pip is configured with (``cert``), for HTTPS indexes."""


@dataclass
class DistFile:
    """One distribution file as an index lists it."""

    filename: str
    yanked: bool = False
    """PEP 592: the index asks installers not to pick it unless pinned."""
    requires_python: Optional[str] = None
    upload_time: Optional[datetime] = None
    """PEP 700; None where the index does not say (HTML pages, local folders)."""


@dataclass
class Release:
    """One version of a package and the files that provide it."""

    version: Version
    files: List[DistFile] = field(default_factory=list)

    @property
    def upload_time(self) -> Optional[datetime]:
        times = [f.upload_time for f in self.files if f.upload_time]
        return min(times) if times else None


def configured_locations(
    environ: Optional[Mapping[str, str]] = None, pip: Optional[Dict[str, str]] = None
) -> Locations:
    """The index URLs and find-links uv is given: the user's uv variables, else pip's configuration translated."""
    environ = dict(os.environ if environ is None else environ)
    pip = pip_config() if pip is None else pip
    env = {k: v for k, v in environ.items() if k in _UV_VARS}
    env.update(uv_environment(environ, pip))
    default = env.get("UV_DEFAULT_INDEX") or env.get("UV_INDEX_URL") or PYPI
    extra = env.get("UV_INDEX", "").split() + env.get("UV_EXTRA_INDEX_URL", "").split()
    # UV_INDEX entries may be named: name=url
    extra = [e.split("=", 1)[1] if "=" in e.split("://", 1)[0] else e for e in extra]
    links = [p for part in env.get("UV_FIND_LINKS", "").split(",") for p in part.split()]
    cafile = pip.get("cert") or environ.get("SSL_CERT_FILE") or None
    return Locations(tuple(dict.fromkeys([default, *extra])), tuple(links), cafile)


class _Anchors(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.files: List[DistFile] = []
        self._attrs: Optional[Dict[str, Optional[str]]] = None
        self._text = ""

    def handle_starttag(self, tag: str, attrs: List[Tuple[str, Optional[str]]]) -> None:
        if tag == "a":
            self._attrs, self._text = dict(attrs), ""

    def handle_data(self, data: str) -> None:
        if self._attrs is not None:
            self._text += data

    def handle_endtag(self, tag: str) -> None:
        if tag != "a" or self._attrs is None:
            return
        href = self._attrs.get("href") or ""
        name = urllib.parse.unquote(href.split("#", 1)[0].rstrip("/").rsplit("/", 1)[-1]) or self._text.strip()
        self.files.append(DistFile(name, "data-yanked" in self._attrs, self._attrs.get("data-requires-python")))
        self._attrs = None


def _parse_time(value: Optional[str]) -> Optional[datetime]:
    if not value:
        return None
    try:
        # Python < 3.11 parses only 3 or 6 fraction digits; a second is precise enough for a cutoff date
        return datetime.fromisoformat(re.sub(r"\.\d+", "", value).replace("Z", "+00:00"))
    except ValueError:
        return None


def parse_simple(body: str, content_type: str) -> List[DistFile]:
    """Files of one project page, PEP 691 JSON or PEP 503 HTML."""
    if "json" in content_type:
        return [
            DistFile(f["filename"], bool(f.get("yanked")), f.get("requires-python"), _parse_time(f.get("upload-time")))
            for f in json.loads(body).get("files", [])
        ]
    parser = _Anchors()
    parser.feed(body)
    return parser.files


def _open(url: str, cafile: Optional[str], timeout: float) -> Optional[Tuple[str, str]]:
    """(body, content type) of a URL; None when it does not exist there."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme == "file":
        path = Path(urllib.request.url2pathname(parts.path))
        path = path / "index.html" if path.is_dir() else path
        return (path.read_text(encoding="utf-8"), "text/html") if path.is_file() else None
    request = urllib.request.Request(url, headers={"Accept": _ACCEPT})
    if parts.username:
        # credentials in the index URL, as pip and uv accept them
        netloc = parts.hostname + (f":{parts.port}" if parts.port else "")
        request = urllib.request.Request(
            urllib.parse.urlunsplit(parts._replace(netloc=netloc)),
            headers={
                "Accept": _ACCEPT,
                "Authorization": "Basic "
                + base64.b64encode(
                    f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}".encode()
                ).decode(),
            },
        )
    context = ssl.create_default_context(cafile=cafile) if parts.scheme == "https" else None
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as resp:
            return resp.read().decode("utf-8"), resp.headers.get("Content-Type", "text/html")
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise


def _find_links_files(link: str, cafile: Optional[str], timeout: float) -> List[DistFile]:
    path = Path(link[7:] if link.startswith("file://") else link)
    if "://" not in link or link.startswith("file://"):
        return [DistFile(p.name) for p in path.iterdir()] if path.is_dir() else []
    page = _open(link, cafile, timeout)
    return parse_simple(*page) if page else []


def list_files(name: str, locations: Locations, timeout: float = 60) -> List[DistFile]:
    """Every file of ``name`` across all locations (uv is run with unsafe-best-match, so all of them count)."""
    project = canonicalize_name(name)
    files: List[DistFile] = []
    errors: List[str] = []
    for index in locations.indexes:
        try:
            page = _open(f"{index.rstrip('/')}/{project}/", locations.cafile, timeout)
        except (OSError, urllib.error.URLError) as exc:
            errors.append(f"{index}: {exc}")
            continue
        if page:
            files += parse_simple(*page)
    for link in locations.find_links:
        try:
            files += _find_links_files(link, locations.cafile, timeout)
        except (OSError, urllib.error.URLError) as exc:
            errors.append(f"{link}: {exc}")
    if errors and not files:
        raise EnvError(f"cannot list releases of {name}: " + "; ".join(errors))
    return files


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
