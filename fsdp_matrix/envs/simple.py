"""The one Simple-API client: a project's files from the configured indexes and find-links.

Used by the release listing of ``bisect`` (which versions exist, yanked or not, uploaded when) and by the download
estimate (how big the wheels are). It reads what uv is given (``config.configured_locations``):
- PEP 691 JSON, preferred, with yanked status (PEP 592), Requires-Python, ``size`` and ``upload-time`` (PEP 700);
- PEP 503 HTML, with ``data-yanked`` and ``data-requires-python``;
- ``file://`` indexes and find-links folders (a local mirror, as this project's CI machines have);
- credentials in the index URL (``https://user:token@host/simple``), as pip and uv accept them, and pip's ``cert``.

Why not the maintained client ``pypi-simple`` (1.8.0, evaluated 2026-11-23): it fetches with ``requests``, which has
no ``file://`` adapter (``InvalidSchema: No connection adapters were found`` for a local index, the kind
this project's own machines are configured with), and it has no notion of find-links folders, so this
module would still need its own local path: two code paths instead of one. It would also add requests,
beautifulsoup4, soupsieve, mailbits and their dependencies to the harness, which is installed into every combo's
env and must resolve together with pins back to 2024. What it does better (PEP 658 metadata, PEP 708 tracks,
digests) nothing here uses. The part that is ours is one GET with an Accept header, Basic auth from the URL, a CA
file, and two parsers; names and versions are parsed by ``packaging``.
"""

from __future__ import annotations

import base64
import json
import re
import ssl
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from datetime import datetime
from html.parser import HTMLParser
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from packaging.utils import canonicalize_name

from fsdp_matrix.envs.config import Locations
from fsdp_matrix.errors import EnvError

_ACCEPT = "application/vnd.pypi.simple.v1+json, text/html;q=0.1"


@dataclass
class DistFile:
    """One distribution file as an index lists it."""

    filename: str
    """The file's name, which carries the project, version and wheel tags."""
    yanked: bool = False
    """PEP 592: the index asks installers not to pick it unless pinned."""
    requires_python: Optional[str] = None
    """The Requires-Python specifier the index gives for the file, if any."""
    upload_time: Optional[datetime] = None
    """PEP 700; None where the index does not say (HTML pages, local folders)."""
    size: Optional[int] = None
    """Bytes, PEP 700; None where the index does not say (HTML pages, local folders)."""
    url: Optional[str] = None
    """Where to download it from (absolute), when the page said."""


class _Anchors(HTMLParser):
    def __init__(self, base_url: str = "") -> None:
        super().__init__()
        self.base_url = base_url
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
        url = urllib.parse.urljoin(self.base_url, href) if href else None
        self.files.append(
            DistFile(name, "data-yanked" in self._attrs, self._attrs.get("data-requires-python"), url=url)
        )
        self._attrs = None


def _parse_time(value: Optional[str]) -> Optional[datetime]:
    if not value:
        return None
    try:
        # Python < 3.11 parses only 3 or 6 fraction digits; a second is precise enough for a cutoff date
        return datetime.fromisoformat(re.sub(r"\.\d+", "", value).replace("Z", "+00:00"))
    except ValueError:
        return None


def _size(value: object) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def parse_simple(body: str, content_type: str, base_url: str = "") -> List[DistFile]:
    """Files of one project page, PEP 691 JSON or PEP 503 HTML; ``base_url`` is the page's, for relative links."""
    if "json" in content_type:
        return [
            DistFile(
                f["filename"],
                bool(f.get("yanked")),
                f.get("requires-python"),
                _parse_time(f.get("upload-time")),
                _size(f.get("size")),
                urllib.parse.urljoin(base_url, f["url"]) if f.get("url") else None,
            )
            for f in json.loads(body).get("files", [])
        ]
    parser = _Anchors(base_url)
    parser.feed(body)
    return parser.files


def fetch(url: str, cafile: Optional[str], timeout: float) -> Optional[Tuple[str, str]]:
    """(body, content type) of a page, over http(s) or from a ``file://`` path; None when it does not exist there."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme == "file":
        path = Path(urllib.request.url2pathname(parts.path))
        path = path / "index.html" if path.is_dir() else path
        return (path.read_text(encoding="utf-8"), "text/html") if path.is_file() else None
    headers = {"Accept": _ACCEPT}
    if parts.username:
        # credentials in the index URL, as pip and uv accept them; urllib would take them for a host name
        netloc = parts.hostname + (f":{parts.port}" if parts.port else "")
        user = f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}"
        headers["Authorization"] = "Basic " + base64.b64encode(user.encode()).decode()
        url = urllib.parse.urlunsplit(parts._replace(netloc=netloc))
    context = ssl.create_default_context(cafile=cafile) if parts.scheme == "https" else None
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, headers=headers), timeout=timeout, context=context
        ) as r:
            return r.read().decode("utf-8"), r.headers.get("Content-Type", "text/html")
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise


def project_files(index: str, name: str, cafile: Optional[str] = None, timeout: float = 60) -> List[DistFile]:
    """Files of ``name`` on one Simple-API index (none when the index does not have it); OSError when unreachable."""
    url = f"{index.rstrip('/')}/{canonicalize_name(name)}/"
    page = fetch(url, cafile, timeout)
    return parse_simple(*page, url) if page else []


def _find_links_files(link: str, cafile: Optional[str], timeout: float) -> List[DistFile]:
    path = Path(link[7:] if link.startswith("file://") else link)
    if "://" not in link or link.startswith("file://"):
        return [DistFile(p.name, size=p.stat().st_size) for p in path.iterdir() if p.is_file()] if path.is_dir() else []
    page = fetch(link, cafile, timeout)
    return parse_simple(*page, link) if page else []


def list_files(name: str, locations: Locations, timeout: float = 60) -> List[DistFile]:
    """Every file of ``name`` across all locations (uv is run with unsafe-best-match, so all of them count).

    EnvError when no location could be read and none gave a file."""
    files: List[DistFile] = []
    errors: List[str] = []
    for index in locations.indexes:
        try:
            files += project_files(index, name, locations.cafile, timeout)
        except (OSError, ValueError, urllib.error.URLError) as exc:
            errors.append(f"{index}: {exc}")
    for link in locations.find_links:
        try:
            files += _find_links_files(link, locations.cafile, timeout)
        except (OSError, ValueError, urllib.error.URLError) as exc:
            errors.append(f"{link}: {exc}")
    if errors and not files:
        raise EnvError(f"cannot list releases of {name}: " + "; ".join(errors))
    return files
