"""Torch for a `cpu` combo when the user's configuration gives no CPU build: PyTorch's CPU index, for torch only.

On PyPI, Linux torch is the CUDA build (about 3 GB with its nvidia libraries), and a CPU run refuses it. So when the
dry run through the user's configuration would pull it, torch alone is taken from PyTorch's CPU index
(``FSDP_MATRIX_TORCH_CPU_INDEX``, default https://download.pytorch.org/whl/cpu; empty turns this off): the wheel of
the pinned release for the env's Python is found there with the Simple-API client (credentials and CA file as for
any index) and installed as a direct reference, ``torch @ <wheel URL>``. Every other package still comes from the
user's configuration. uv's ``--torch-backend`` is not used: its index URL is fixed, and it changes other packages.

The user's configuration always wins: the CPU index is used only when nothing the user configured (an index other
than PyPI, a find-links folder or page, through pip's configuration or ``UV_*``) serves any torch build at all. A
configuration that yields a CPU torch is never touched; one that serves only the CUDA build (a mirror of PyPI, say)
or sets ``UV_TORCH_BACKEND`` keeps its choice, and the refusal says so. When the CPU index cannot be read, the
refusal stays.
"""

from __future__ import annotations

import os
import urllib.error
from pathlib import Path
from typing import List, Mapping, Optional, Sequence, Tuple

from packaging.requirements import InvalidRequirement, Requirement
from packaging.tags import compatible_tags, cpython_tags
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from fsdp_matrix.envs.check import python_version
from fsdp_matrix.envs.config import PYPI, Locations
from fsdp_matrix.envs.simple import list_files, project_files
from fsdp_matrix.errors import EnvError

TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
"""PyTorch's CPU index, unless FSDP_MATRIX_TORCH_CPU_INDEX says otherwise (empty: off)."""


def cpu_index(environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """The CPU index to take torch from, or None when the user turned it off or chose uv's torch backend."""
    environ = os.environ if environ is None else environ
    if environ.get("UV_TORCH_BACKEND"):
        return None
    return environ.get("FSDP_MATRIX_TORCH_CPU_INDEX", TORCH_CPU_INDEX).strip() or None


def user_torch_sources(locations: Locations, timeout: float = 60) -> List[str]:
    """The locations the user configured (any index but PyPI, every find-links) that serve some torch build.

    An unreachable location serves nothing here; uv's own run will say what is wrong with it."""
    found = []
    own = [i for i in locations.indexes if i.rstrip("/") != PYPI] + [("links", f) for f in locations.find_links]
    for where in own:
        links = isinstance(where, tuple)
        url = where[1] if links else where
        one = Locations((), (url,), locations.cafile) if links else Locations((url,), (), locations.cafile)
        try:
            files = list_files("torch", one, timeout)
        except EnvError:
            continue
        if any(_project(f.filename) == "torch" for f in files):
            found.append(url)
    return found


def _project(filename: str) -> str:
    # find-links folders list every file they hold: keep torch's own wheels and sdists
    if filename.endswith(".whl"):
        try:
            return str(parse_wheel_filename(filename)[0])
        except InvalidWheelFilename:
            return ""
    return canonicalize_name(filename.rsplit("-", 1)[0]) if filename.endswith((".tar.gz", ".zip")) else ""


def torch_pin(requirements: Sequence[str]) -> Optional[Tuple[int, str]]:
    """(position, version) of an exact ``torch==V`` among the requirements."""
    for i, text in enumerate(requirements):
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        specs = list(req.specifier)
        if canonicalize_name(req.name) == "torch" and len(specs) == 1 and specs[0].operator == "==":
            return i, specs[0].version
    return None


def cpu_wheel_url(
    index: str, version: str, python: Tuple[int, int], cafile: Optional[str] = None, timeout: float = 60
) -> str:
    """URL of the CPU wheel of torch ``version`` on ``index`` for ``python`` on this platform; EnvError if none."""
    try:
        files = project_files(index, "torch", cafile, timeout)
    except (OSError, ValueError, urllib.error.URLError) as exc:
        raise EnvError(f"PyTorch's CPU index {index} (FSDP_MATRIX_TORCH_CPU_INDEX) cannot be read: {exc}") from None
    rank = {t: i for i, t in enumerate([*cpython_tags(python), *compatible_tags(python)])}
    want = Version(Version(version).public)
    best: Optional[Tuple[int, int, str]] = None
    for f in files:
        try:
            _, fversion, _, tags = parse_wheel_filename(f.filename)
        except (InvalidWheelFilename, InvalidVersion):
            continue
        fit = min((rank[t] for t in tags if t in rank), default=None)
        if fit is None or f.yanked or not f.url or Version(fversion.public) != want:
            continue
        # a plain "+cpu" build before variants such as "+cpu.cxx11.abi"
        key = (0 if fversion.local == "cpu" else 1, fit, f.url)
        best = key if best is None or key < best else best
    if best is None:
        raise EnvError(
            f"PyTorch's CPU index {index} (FSDP_MATRIX_TORCH_CPU_INDEX) has no build of torch {version} "
            f"for Python {python[0]}.{python[1]} here"
        )
    return best[2]


def with_cpu_torch(
    requirements: Sequence[str], python: Path, index: str, cafile: Optional[str] = None
) -> Tuple[List[str], str]:
    """The requirements with ``torch==V`` replaced by ``torch @ <CPU wheel URL>``, and the pinned version.

    EnvError when there is no exact torch pin, or no CPU wheel of it can be found on the index."""
    pin = torch_pin(requirements)
    if pin is None:
        raise EnvError("no exact torch pin to take from the CPU index")
    position, version = pin
    url = cpu_wheel_url(index, version, python_version(python), cafile)
    swapped = list(requirements)
    swapped[position] = f"torch @ {url}"
    return swapped, version
