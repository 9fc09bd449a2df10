"""The few exceptions the harness raises on purpose. Everything else is a bug in the harness."""

from __future__ import annotations


class MatrixError(Exception):
    """Base class: a problem the user can fix, reported as one line."""


class MatrixConfigError(MatrixError):
    """matrix.yaml is malformed. The message names the offending key."""


class UnknownCellError(MatrixError):
    """A cell id or case id that matrix.yaml does not define."""


class EnvError(MatrixError):
    """An environment could not be built, installed, imported or verified against its pins."""


class ReproError(MatrixError):
    """A repro script cannot be loaded: the file is missing, does not import, or defines no ``run``. Raised on the
    ranks, where it becomes the cell's observed error (type ``fsdp_matrix.errors.ReproError``), naming the file."""


class ResultsError(MatrixError):
    """The results file cannot be appended to, or the results (or a launch) directory was removed during the run.
    The run stops at once: a cell run now could not be recorded, and a cell whose launch directory went is not hung.
    The message names the path."""


class LaunchError(MatrixError):
    """torchrun could not be started or died before any cell ran."""


class CheckFailed(AssertionError):
    """Training ran, but a post-training check failed: the fix does not hold.

    Raised inside a rank; it is recorded like any other observed error, with type ``CheckFailed``.
    """
