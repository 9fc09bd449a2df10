"""The wheels of a site: its exact requirements and, read from each wheel's METADATA, what they need that neither the
image nor a site under it holds. Fetched one by one with ``pip download --no-deps`` for the image's Python and
platform (the device README's recipe), so nothing the image already has (torch, above all) is ever downloaded.

pip reads the user's own configuration (pip.conf, PIP_INDEX_URL, PIP_FIND_LINKS): a mirror or a wheel folder is
honoured as for any install. Tests hand in a downloader of their own and need no network.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import zipfile
from email.parser import Parser
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Set

from packaging.markers import default_environment
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

from fsdp_matrix.device import image
from fsdp_matrix.errors import EnvError

Downloader = Callable[[str, Path], Path]
"""(requirement, folder) -> the wheel it saved there."""


def marker_environment() -> Dict[str, str]:
    """The image's interpreter, for evaluating Requires-Dist markers: CPython 3.12.3 on x86-64 Linux."""
    env = default_environment()
    env.update(
        python_version=image.PYTHON, python_full_version="3.12.3", sys_platform="linux", platform_system="Linux",
        platform_machine="x86_64", implementation_name="cpython", platform_python_implementation="CPython",
        os_name="posix", extra="",
    )  # fmt: skip
    return env


def requires(wheel: Path) -> List[Requirement]:
    """The wheel's Requires-Dist that apply on the image without extras."""
    with zipfile.ZipFile(wheel) as zf:
        name = next((n for n in zf.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1), None)
        if name is None:
            raise EnvError(f"{wheel.name}: no .dist-info/METADATA in the wheel")
        meta = Parser().parsestr(zf.read(name).decode("utf-8", "replace"))
    env, out = marker_environment(), []
    for text in meta.get_all("Requires-Dist") or []:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        if req.marker is None or req.marker.evaluate(env):
            out.append(req)
    return out


def trim(wheel: Path, keep: Sequence[str]) -> Optional[str]:
    """Rewrite ``wheel`` without the native libraries (``*.so`` at the package's top) that ``keep`` does not name, its
    RECORD updated to match; the line to say, or None when there was nothing to drop (already trimmed)."""
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        drop = {n for n in names if n.count("/") == 1 and n.endswith(".so") and n.split("/")[1] not in keep}
        if not drop:
            return None
        before = wheel.stat().st_size
        tmp = wheel.with_suffix(".trimming")
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as out:
            for info in zf.infolist():
                if info.filename in drop:
                    continue
                data = zf.read(info)
                if info.filename.endswith(".dist-info/RECORD"):
                    lines = data.decode().splitlines(keepends=True)
                    data = "".join(line for line in lines if line.split(",", 1)[0] not in drop).encode()
                out.writestr(info, data)
    tmp.replace(wheel)
    kept = ", ".join(sorted(n.split("/")[1] for n in names if n.endswith(".so") and n not in drop))
    return f"{wheel.name}: {before / 2**20:.1f} -> {wheel.stat().st_size / 2**20:.1f} MiB, keeps {kept}"


def pip_command() -> List[str]:
    """This interpreter's pip, else the first ``python3`` on PATH with one (a uv-made venv has no pip of its own)."""
    import importlib.util
    import shutil

    if importlib.util.find_spec("pip") is not None:
        return [sys.executable, "-m", "pip"]
    python3 = shutil.which("python3")
    if python3 is None:
        raise EnvError("no pip: install pip into this env (python -m ensurepip) or put a python3 with pip on PATH")
    return [python3, "-m", "pip"]


def pip_downloader(extra_args: Iterable[str] = ()) -> Downloader:
    """``pip download --no-deps`` of one requirement for the image's Python 3.12 and manylinux x86-64."""
    platforms = [a for p in image.PLATFORMS for a in ("--platform", p)]

    def download(requirement: str, folder: Path) -> Path:
        with tempfile.TemporaryDirectory(dir=folder) as tmp:
            cmd = [*pip_command(), "download", "--no-deps", "--only-binary=:all:", "--python-version",
                   image.PYTHON, "--implementation", "cp", *platforms, "-d", tmp, *extra_args, requirement]  # fmt: skip
            done = subprocess.run(cmd, capture_output=True, text=True)
            got = list(Path(tmp).glob("*.whl"))
            if done.returncode or len(got) != 1:
                tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no wheel saved"]
                raise EnvError(f"pip download {requirement}: {tail[0]}")
            return got[0].replace(folder / got[0].name)

    return download


def _existing(folder: Path, req: Requirement) -> Optional[Path]:
    for path in sorted(folder.glob("*.whl")):
        try:
            name, version, *_ = parse_wheel_filename(path.name)
        except InvalidWheelFilename:
            continue
        if name == canonicalize_name(req.name) and req.specifier.contains(version, prereleases=True):
            return path
    return None


def wheel_versions(paths: Iterable[Path]) -> Dict[str, str]:
    """name -> version of the wheels ``paths`` (what a site carries)."""
    out = {}
    for path in paths:
        try:
            name, version, *_ = parse_wheel_filename(path.name)
        except InvalidWheelFilename:
            continue
        out[str(name)] = str(version)
    return out


def _provided(dep: Requirement, below: Dict[str, str], wanted: Set[str]) -> bool:
    """True when the image or a site under this one provides ``dep``: a site's wheel only at a version that fits
    (this site, in front, shadows it otherwise); the image's packages as they are (their versions are not known)."""
    name = canonicalize_name(dep.name)
    if name in below:
        return dep.specifier.contains(below[name], prereleases=True)
    return name in image.INSTALLED and name not in wanted


def fetch_site(
    site: image.Site,
    folder: Path,
    download: Downloader,
    below: Dict[str, str],
    say: Callable[[str], None] = print,
    keep: Optional[Mapping[str, Sequence[str]]] = None,
) -> List[Path]:
    """The site's wheels in ``folder`` (a wheel already there that fits is kept): its requirements and every
    dependency that neither the image nor ``below`` (name -> version the sites under it carry) provides. A wheel
    named in ``keep`` is trimmed to the native libraries it lists (image.TRIM)."""
    folder.mkdir(parents=True, exist_ok=True)
    keep = keep or {}
    queue = [Requirement(r) for r in site.wants]
    wanted = {canonicalize_name(r.name) for r in queue}
    done: Dict[str, Path] = {}
    while queue:
        req = queue.pop(0)
        name = canonicalize_name(req.name)
        if name in done:
            continue
        path = _existing(folder, req)
        how = "kept"
        if path is None:
            path, how = download(str(req), folder), "downloaded"
        trimmed = trim(path, keep[name]) if name in keep else None
        if trimmed:
            say(f"  {site.name}: trimmed for the trip: {trimmed}")
        done[name] = path
        say(f"  {site.name}: {path.name} ({path.stat().st_size / 2**20:.1f} MiB, {how})")
        for dep in requires(path):
            if canonicalize_name(dep.name) not in done and not _provided(dep, below, wanted):
                queue.append(dep)
    stale = [p for p in folder.glob("*.whl") if p not in done.values()]
    for path in stale:  # two versions of one package stop pip's install there
        path.unlink()
    return sorted(done.values())
