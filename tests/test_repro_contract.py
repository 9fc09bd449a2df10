"""Every repro keeps the standalone contract and names a case that matrix.yaml defines with that script."""

from __future__ import annotations

import importlib.util
import inspect
from pathlib import Path

import pytest

from fsdp_matrix.matrix import load_matrix

ROOT = Path(__file__).resolve().parents[1]
MATRIX = load_matrix(ROOT / "matrix.yaml")


@pytest.mark.parametrize("case", MATRIX.cases, ids=lambda c: c.id)
def test_repro_contract(case):
    path = ROOT / case.repro
    spec = importlib.util.spec_from_file_location(f"repro_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.CASE == case.id
    assert list(inspect.signature(module.run).parameters) == ["params", "ctx"]
    assert 'if __name__ == "__main__":' in path.read_text()


def test_every_repro_file_has_a_case():
    assert {c.repro for c in MATRIX.cases} == {f"repros/{p.name}" for p in (ROOT / "repros").glob("*.py")}
