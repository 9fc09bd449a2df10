"""How much an install would download: what a ``uv pip install --dry-run`` plans, less what uv has cached.

Used to announce a CUDA build of torch (about 3 GB with its nvidia libraries) before the download starts. Sizes come
from the index's PEP 691 JSON (``size``, PEP 700), which PyPI serves, read with the one Simple-API client
(``envs.simple``, with the index's credentials and CA file); a file that is already in uv's cache costs nothing.
Whatever cannot be told (an HTML-only index, no network) is counted as unknown, never guessed.
"""

from __future__ import annotations

import re
import subprocess
import urllib.error
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Tuple

from packaging.tags import sys_tags
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from fsdp_matrix.envs.config import Locations
from fsdp_matrix.envs.simple import project_files

_PLANNED = re.compile(r"^\s*\+\s*([A-Za-z0-9_.-]+)==(\S+)", flags=re.M)


def planned(dry_run_output: str) -> List[Tuple[str, str]]:
    """(name, version) of every package a dry run would install."""
    return [(canonicalize_name(n), v) for n, v in _PLANNED.findall(dry_run_output)]


def uv_cache_dir(env: Mapping[str, str]) -> Optional[Path]:
    try:
        out = subprocess.run(["uv", "cache", "dir"], capture_output=True, text=True, timeout=30, env=dict(env))
    except (OSError, subprocess.TimeoutExpired):
        return None
    return Path(out.stdout.strip()) if out.returncode == 0 and out.stdout.strip() else None


def in_uv_cache(cache: Optional[Path], name: str, version: str) -> bool:
    """True when uv's wheel cache holds a build of name==version (``wheels-v*/<index>/<name>/<version>-<tags>``)."""
    if cache is None:
        return False
    for entry in cache.glob(f"wheels-v*/**/{name}/{version}-*"):
        if entry.suffix not in (".http", ".lock", ".msgpack") and entry.exists():
            return True
    return False


def wheel_size(name: str, version: str, locations: Locations, timeout: float = 20) -> Optional[int]:
    """Size in bytes of the wheel of name==version an installer here would pick, from the first index that says."""
    tags = {t: i for i, t in enumerate(sys_tags())}
    for index in locations.indexes:
        try:
            files = project_files(index, name, locations.cafile, timeout)
        except (OSError, ValueError, urllib.error.URLError):
            continue
        best: Optional[Tuple[int, int]] = None
        for f in files:
            try:
                _, fversion, _, ftags = parse_wheel_filename(f.filename)
            except (InvalidWheelFilename, InvalidVersion):
                continue
            rank = min((tags[t] for t in ftags if t in tags), default=None)
            if rank is None or f.yanked or f.size is None or fversion != Version(version):
                continue
            if best is None or rank < best[0]:
                best = (rank, f.size)
        if best is not None:
            return best[1]
    return None


@dataclass
class Estimate:
    """What an install would fetch."""

    packages: int = 0
    """Packages the dry run would install."""
    to_fetch: int = 0
    """Bytes of the packages not in uv's cache whose size the index gave."""
    cached: int = 0
    """Packages already in uv's cache (no download)."""
    unknown: List[str] = field(default_factory=list)
    """Packages not cached whose size could not be read."""

    def describe(self) -> str:
        if self.unknown and not self.to_fetch:
            size = "size unknown"  # an index without PEP 700 sizes: "about 0 B" would announce 3 GB as nothing
        else:
            size = f"{'at least' if self.unknown else 'about'} {human(self.to_fetch)} to download"
        text = f"{size} ({self.packages - self.cached} of {self.packages} packages not in uv's cache"
        if self.unknown:
            text += f"; size unknown for {', '.join(self.unknown[:4])}" + ("..." if len(self.unknown) > 4 else "")
        return text + ")"


def estimate(dry_run_output: str, env: Mapping[str, str], locations: Locations, timeout: float = 20) -> Estimate:
    """What the install planned in ``dry_run_output`` would download from ``locations`` (``env``: uv's, for its
    cache)."""
    plan = planned(dry_run_output)
    cache = uv_cache_dir(env)
    missing = [(n, v) for n, v in plan if not in_uv_cache(cache, n, v)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        sizes: Dict[str, Optional[int]] = dict(
            zip([n for n, _ in missing], pool.map(lambda nv: wheel_size(nv[0], nv[1], locations, timeout), missing))
        )
    return Estimate(
        packages=len(plan),
        to_fetch=sum(s for s in sizes.values() if s),
        cached=len(plan) - len(missing),
        unknown=[n for n, s in sizes.items() if s is None],
    )


def human(size: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit in ("B", "KB") else f"{size:.1f} {unit}"
        size /= 1000
    return f"{size:.1f} GB"
