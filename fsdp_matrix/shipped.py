"""Where the cases are read from: matrix.yaml and repros/ at the top of a checkout (an editable install too), or the
copies an installed wheel ships as package data (``fsdp_matrix/_data``, pyproject.toml's force-include).

``pip install "fsdp-matrix @ git+URL@SHA"`` (or ``pip install <checkout>``) gives upstream's CI the harness with
its cases, found here through ``importlib.resources``; the repository keeps its layout. The runner hands repro
paths to torchrun's ranks, so they must be files on disk: a wheel installs unpacked, and a zip import is refused.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parent.parent
"""The repository root when this package runs from a checkout."""
DATA = "_data"
"""The package folder a wheel holds matrix.yaml and repros/ in."""


def cases_root() -> Path:
    """The folder holding matrix.yaml and repros/: the wheel's copy when installed, else the checkout."""
    shipped = resources.files("fsdp_matrix").joinpath(DATA)
    if shipped.joinpath("matrix.yaml").is_file():
        path = Path(str(shipped))
        if not (path / "matrix.yaml").is_file():  # a zip import: no path a rank could open
            raise RuntimeError(f"fsdp-matrix: the cases at {shipped} are not files on disk; install it unpacked")
        return path
    return CHECKOUT
