"""The rehearsal's venv: the device image's versions of the packages under test, on this machine's CPU.

``bash DIR/run.sh --rehearse`` runs the plan against this venv with ``--device cpu``, after installing the same
wheels into the same ``--target`` sites: a missing wheel, a wrong path or an import error shows here, before device
time is spent. The venv holds no pydantic, bitsandbytes or trl of its own (the image has none): those come from the
sites, as there.

Torch is built as for any CPU combo (fsdp_matrix/envs/): the user's pip/uv index configuration first, then PyTorch's
CPU index; where neither serves a CPU build of 2.11.0 for Python 3.12, the CUDA build from the index (it runs on
CPU), its download size said before it starts.
"""

from __future__ import annotations

import glob
import shutil
import subprocess
import sys
from pathlib import Path
from typing import List, Optional

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from fsdp_matrix.device import image

PINS = {k: v for k, v in image.VERSIONS.items() if v}
"""The rule packages at the image's versions (peft: the planned stand-in, image.VERSIONS)."""
EXTRA = [
    "tokenizers==0.23.2", "huggingface-hub==1.33.0", "safetensors==0.8.0",
    # the harness's own requirements that the image has (pyproject.toml), pydantic left out: it travels as a wheel
    "packaging", "pyyaml", "filelock", "psutil", "pytest", "pytest-xdist", "pytest-timeout", "regex",
]  # fmt: skip
"""The image's other versions that matter to the cells (KINDS.md's pip list)."""


def python312() -> Optional[str]:
    """A CPython 3.12 here: ``python3.12`` on PATH if it runs, else a pyenv one; None when there is none."""
    candidates = [shutil.which("python3.12")] + sorted(
        glob.glob(str(Path.home() / ".pyenv/versions/3.12*/bin/python3.12"))
    )
    for candidate in filter(None, candidates):
        if subprocess.run([candidate, "-c", "pass"], capture_output=True).returncode == 0:
            return candidate
    return None


def image_needs(wheels_root: Path) -> List[str]:
    """What the carried wheels need from the image (requests for transformers 4.46.3, pyarrow for datasets, ...): the
    image holds it, so no wheel travels, and the venv must hold it too or the rehearsal fails where the device would
    not. Names only: the image's versions are not known."""
    from fsdp_matrix.device.wheels import requires

    carried = {canonicalize_name(w.split("==")[0]) for s in image.SITES for w in s.wants} | set(PINS)
    names = set()
    for wheel in sorted(wheels_root.glob("*/*.whl")):
        names |= {canonicalize_name(r.name) for r in requires(wheel)}
    return sorted(n for n in names if n in image.INSTALLED and n not in carried)


def build(venv: Path, wheels_root: Path) -> int:
    """Create (or reuse, by its stamp) the rehearsal venv; 0 when ready, 1 when not (the reason printed)."""
    from fsdp_matrix import envs

    python = python312()
    if python is None:
        print("rehearse: no Python 3.12 here (the image's is 3.12): install one (uv python install 3.12, pyenv)")
        return 1
    if not (venv / "bin" / "python").exists():
        subprocess.run(["uv", "venv", "--quiet", "--python", python, str(venv)], check=True)
    print(f"rehearse: venv {venv} (Python {python}); installing {', '.join(f'{k} {v}' for k, v in PINS.items())}")
    named = {canonicalize_name(Requirement(r).name) for r in EXTRA}
    extra = EXTRA + [n for n in image_needs(wheels_root) if n not in named]
    report = envs.prepare(venv, PINS, extra, device="cpu", allow_cuda_build=True, label="device-rehearsal")
    if not report.ok:
        print(f"rehearse: the venv is not ready: {report.message.splitlines()[0] if report.message else ''}")
        return 1
    how = "reused" if report.reused else f"installed in {report.install_s:.0f}s"
    print(f"rehearse: venv {how}: " + ", ".join(f"{k} {v}" for k, v in report.versions.items() if v))
    return 0


def main(argv: List[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m fsdp_matrix.device.rehearse VENV WHEELS_DIR", file=sys.stderr)
        return 2
    return build(Path(argv[0]), Path(argv[1]))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
