"""``nox -s device -- --prepare DIR``: the wheels, the plan and run.sh of a device run, and what it all weighs.

What travels to the device machine is the working tree as git would send it (tracked files and untracked ones not
ignored) plus the paths the call carries, 64 MiB in all. DIR must be inside the repo and ignored (``.device/`` is, by
.gitignore), so that only the call's own sites travel, named in its ``carry``. When everything does not fit one call,
the steps are packed into several, in order of value, each within the limit.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from argparse import ArgumentTypeError
from dataclasses import replace
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Sequence

from fsdp_matrix.device import image, plan, wheels
from fsdp_matrix.errors import EnvError
from fsdp_matrix.matrix import DEFAULT_MATRIX, load_matrix
from fsdp_matrix.usage import OneLineParser

LIMIT = 64 << 20
"""What one device call may carry: the working tree and the carried paths together."""
RUN_SH = Path(__file__).with_name("run.sh")


class PrepareError(ValueError):
    """A DIR or repo that cannot hold a device run: one line, exit 2."""


def tree_bytes(root: Path) -> int:
    """The working tree as git sends it: tracked files and untracked files not ignored."""
    done = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "-co", "--exclude-standard"], capture_output=True)
    if done.returncode:
        raise PrepareError(f"{root} is not a git checkout: the device tool sends a repo's working tree")
    paths = [root / p for p in done.stdout.decode("utf-8", "surrogateescape").split("\0") if p]
    return sum(p.stat().st_size for p in paths if p.is_file() and not p.is_symlink())


def check_dir(root: Path, folder: Path) -> None:
    """DIR inside the repo, and ignored by git (else it would travel whole with every call, and count twice)."""
    try:
        folder.resolve().relative_to(root.resolve())
    except ValueError:
        raise PrepareError(f"{folder} is outside the repo {root}: only the repo travels to the device") from None
    probe = folder / "plan.json"
    done = subprocess.run(["git", "-C", str(root), "check-ignore", "-q", str(probe)], capture_output=True)
    if done.returncode != 0:
        raise PrepareError(f"{folder} is not ignored by git: add it to .gitignore or .git/info/exclude (e.g. .device/)")


def fetch_all(
    folder: Path, download: wheels.Downloader, say: Callable[[str], None], keep: Mapping[str, Sequence[str]]
) -> Dict[str, List[Path]]:
    """Every site's wheels under folder/wheels/SITE; a site stacked on others skips what they carry."""
    got: Dict[str, List[Path]] = {}
    for k, site in enumerate(image.SITES, 1):
        below = wheels.wheel_versions(p for s in reversed(image.stack(site.name)[1:]) for p in got[s])
        say(f"[prepare {k}/{len(image.SITES)}] site {site.name}: {site.why}")
        got[site.name] = wheels.fetch_site(site, folder / "wheels" / site.name, download, below, say, keep)
    return got


def mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def prepare(
    root: Path,
    folder: Path,
    download: wheels.Downloader,
    limit: int = LIMIT,
    matrix_path: Optional[Path] = None,
    say: Callable[[str], None] = print,
    keep: Mapping[str, Sequence[str]] = image.TRIM,
) -> plan.Plan:
    """Write DIR's wheels, plan.json and run.sh; say each call's size and carry. PrepareError when no call can fit."""
    check_dir(root, folder)
    folder.mkdir(parents=True, exist_ok=True)
    got = fetch_all(folder, download, say, keep)
    site_bytes = {name: sum(p.stat().st_size for p in paths) for name, paths in got.items()}
    shutil.copy(RUN_SH, folder / "run.sh")
    os.chmod(folder / "run.sh", 0o755)
    steps, two = plan.build_steps(load_matrix(matrix_path or DEFAULT_MATRIX))
    tree = tree_bytes(root)
    fixed = tree + (folder / "run.sh").stat().st_size + 64 * 1024  # plan.json is a few tens of KiB
    try:
        calls = plan.pack(steps, site_bytes, fixed, limit)
    except ValueError as exc:
        raise PrepareError(f"cannot fit the device's {mib(limit)}: {exc}") from None
    rel = folder.resolve().relative_to(root.resolve()).as_posix()
    calls = [
        replace(c, carry=(f"{rel}/run.sh", f"{rel}/plan.json", *(f"{rel}/wheels/{s}" for s in c.sites))) for c in calls
    ]
    versions = {s.name: dict(s.versions) for s in image.SITES}
    smoke = plan.smoke_cells(load_matrix(matrix_path or DEFAULT_MATRIX))
    result = plan.Plan(steps, calls, two, versions=versions, smoke=smoke)
    (folder / "plan.json").write_text(result.to_json())
    everything = tree + sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    say(f"total: working tree {mib(tree)} + {rel}/ {mib(everything - tree)} = {mib(everything)} "
        f"(limit {mib(limit)}): {'one call' if len(calls) == 1 else f'split into {len(calls)} calls'}")  # fmt: skip
    for c in calls:
        say(f"call {c.index}: {mib(c.bytes)}, steps {', '.join(c.steps)}")
        say(f"  carry: {list(c.carry)}")
        say(f"  command: bash {rel}/run.sh --call {c.index} --out $OUT")
    say(f"{len(two)} cell(s) need 2 GPUs (plan.json's needs_2_gpus); rehearse here: bash {rel}/run.sh --rehearse")
    return result


def positive_mib(text: str) -> float:
    """An argparse type: MiB above zero."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < 1e6:
        raise ArgumentTypeError(f"{text!r} is not a size in MiB above 0")
    return value


def main(argv: Optional[List[str]] = None) -> int:
    p = OneLineParser(prog="fsdp_matrix device", description="prepare a device run (docs/pages/gpu.md)")
    p.add_argument("--prepare", type=Path, required=True, metavar="DIR", help="folder inside the repo, ignored by git")
    p.add_argument(
        "--no-trim", action="store_true", help="carry all of bitsandbytes' native libraries (image.TRIM); a fresh DIR"
    )
    p.add_argument("--limit-mib", type=positive_mib, default=LIMIT / 2**20, help="what one call may carry (default 64)")
    args = p.parse_args(argv)
    root = Path(__file__).resolve().parents[2]
    folder = args.prepare if args.prepare.is_absolute() else Path.cwd() / args.prepare
    try:
        keep = {} if args.no_trim else image.TRIM
        prepare(root, folder, wheels.pip_downloader(), int(args.limit_mib * 2**20), keep=keep)
    except PrepareError as exc:
        print(f"device --prepare: {exc}", file=sys.stderr)
        return 2
    except EnvError as exc:
        print(f"device --prepare: {exc}", file=sys.stderr)
        return 1
    return 0
