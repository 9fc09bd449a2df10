"""Run an exported script alone, as a maintainer would, and judge what it printed against matrix.yaml.

The run is isolated from this checkout: ``python -I`` from the script's own folder, with a ``fsdp_matrix`` package
on PYTHONPATH that fails on import (the torchrun ranks would otherwise find an installed harness), and a private
TMPDIR, so a scratch folder left behind shows.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence

from fsdp_matrix.cells import expand_case, unmet_requirement
from fsdp_matrix.expectations import Expected, expected_for
from fsdp_matrix.verdicts import Judgement, judge

POISON = "raise ImportError('the exported script imported fsdp_matrix')\n"
_ERROR = re.compile(
    r"rank \d+: (?P<type>[\w.]+): (?P<message>.*?) \(raised in (?P<where>[\w.<>]+)\)(?:; rank \d+: |$)", re.S
)
_WARNED = re.compile(r"^(?:\[rank\d+\]:\s*)?\S+\.py:\d+: (?P<category>\w+): (?P<message>.+)$", re.M)
"""A warning as Python prints it on a rank's stderr: ``path.py:LINE: Category: message``."""


@dataclass
class Alone:
    """One run of an exported script on its own."""

    returncode: int
    """The script's exit status (1 when a rank raised)."""
    output: str
    """stdout and stderr."""
    leftovers: List[str]
    """Names left in the private TMPDIR after the run (the ranks' scratch folder must not outlive it)."""
    stdout: str = ""
    """stdout alone: rank 0 prints the outcome last there."""

    @property
    def outcome(self) -> str:
        """What follows ``===== outcome:`` (empty when the script never got there)."""
        head, sep, tail = self.stdout.partition("===== outcome: ")
        return tail.strip() if sep else ""

    def judge(self, expected: Expected) -> Judgement:
        """The verdict of this run, as the matrix would give it for the same observation (the warnings the ranks
        printed included: an error rule may name the warning its run raises first)."""
        return judge_outcome(self.outcome, expected, self.output[-300:], printed_warnings(self.output))


def printed_warnings(output: str) -> List[Dict[str, str]]:
    """The warnings a run printed, as RankResult.warnings records them (``category``, ``message``)."""
    return [{"category": m["category"], "message": m["message"]} for m in _WARNED.finditer(output)]


def judge_outcome(
    outcome: str, expected: Expected, tail: str = "", warnings: Sequence[Mapping[str, str]] = ()
) -> Judgement:
    """The verdict of rank 0's outcome line (what follows ``===== outcome:``), as the matrix would give it for the
    same observation; ``tail``: what the run printed last, for a run that never got to its outcome; ``warnings``: what
    its ranks printed (``printed_warnings``)."""
    outcome = outcome.strip().removeprefix("===== outcome:").strip()
    if not outcome:
        return judge(expected, "crash", message=tail)
    if outcome.startswith("every rank trained"):
        return judge(expected, "ok", warnings=warnings)
    m = _ERROR.match(outcome)
    if m is None:
        return judge(expected, "crash", message=outcome)
    where = _harness_location(m["where"], expected)
    return judge(expected, "error", m["type"], m["message"], where, warnings=warnings)


SCRIPT_MODULES = ("__main__.",)
"""What the script's own functions are called in a run of it."""


def _harness_location(where: str, expected: Expected) -> str:
    """``where`` as the matrix would name it: a check of the harness (``module: fsdp_matrix...``) is inlined into
    the script, so an error its function raised there is named after the script's module instead."""
    module = expected.module or ""
    if module.startswith("fsdp_matrix.") and where.startswith(SCRIPT_MODULES):
        return f"{module}.{where.split('.', 1)[1]}"
    return where


def run_alone(script: Path, python: str = sys.executable, timeout: float = 600) -> Alone:
    """Run ``script`` from its folder with the repo unreachable; see the module docstring."""
    with tempfile.TemporaryDirectory(prefix="fsdp-export-alone-") as tmp:
        poison = Path(tmp, "poison", "fsdp_matrix")
        poison.mkdir(parents=True)
        (poison / "__init__.py").write_text(POISON)
        scratch = Path(tmp, "tmp")
        scratch.mkdir()
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("PYTHON", "TORCHELASTIC", "MASTER_")) and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")
        }
        env.update(PYTHONPATH=str(poison.parent), TMPDIR=str(scratch))
        try:
            proc = subprocess.run(
                [python, "-I", script.name], cwd=script.parent, env=env, capture_output=True, text=True, timeout=timeout
            )
            code, out, stdout = proc.returncode, proc.stdout + proc.stderr, proc.stdout
        except subprocess.TimeoutExpired as exc:
            code, out, stdout = 124, f"timed out after {timeout:.0f} s\n{exc.stdout or ''}{exc.stderr or ''}", ""
        return Alone(code, out, sorted(p.name for p in scratch.iterdir()), stdout)


def pick_cell(case, versions):
    """The case's first cell that can run on CPU and that matrix.yaml expects to raise the report with ``versions``,
    else its first expected to train, else its first."""
    cells = expand_case(case)
    runnable = [c for c in cells if unmet_requirement(case.requires, c) is None]
    for kind in ("error", "ok"):
        for cell in runnable:
            if expected_for(case, cell, versions).kind == kind:
                return cell
    return (runnable or cells)[0]


def installed_versions(matrix) -> Dict[str, Optional[str]]:
    """The installed version of every package a combo of ``matrix`` pins (None where it is not installed)."""
    out: Dict[str, Optional[str]] = {}
    for name in dict.fromkeys(n for combo in matrix.combos for n in combo.pins.model_dump()):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def matching_combo_id(matrix, versions) -> Optional[str]:
    """The combo whose pins are exactly the installed ``versions`` (local labels such as +cpu ignored)."""
    for combo in matrix.combos:
        pins = combo.pins.model_dump()
        if all((versions.get(n) or "").split("+")[0] == v for n, v in pins.items()):
            return combo.id
    return None
