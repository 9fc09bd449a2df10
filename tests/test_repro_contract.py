"""Every repro keeps the standalone contract, names a case that matrix.yaml defines with that script, and takes
harness code only through the case API's one door, ``fsdp_matrix.case``."""

from __future__ import annotations

import ast
import importlib.util
import inspect
from pathlib import Path
from typing import List

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


FACADE = "fsdp_matrix.case"


def harness_imports(source: str) -> List[str]:
    """The imports of harness code in ``source`` (anywhere, a function's body and the ``__main__`` block included)
    other than the facade's: ``line: module.name``. Third-party imports (torch, peft, ...) are not harness code."""

    def harness(module: str) -> bool:
        return module == "fsdp_matrix" or module.startswith("fsdp_matrix.")

    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [f"{node.lineno}: {a.name}" for a in node.names if harness(a.name) and a.name != FACADE]
        elif isinstance(node, ast.ImportFrom) and (node.level or harness(node.module or "")):
            module = "." * node.level + (node.module or "")
            found += [
                f"{node.lineno}: {module}.{a.name}"
                for a in node.names
                if module != FACADE and f"{module}.{a.name}" != FACADE
            ]
    return found


def test_harness_imports_names_each_door_but_the_facade():
    source = (
        "import torch\nfrom peft import LoraConfig\nfrom fsdp_matrix.case import axis, main\n"
        "import fsdp_matrix.case\nfrom fsdp_matrix import case\n"
        "from fsdp_matrix.workload.params import flag\nimport fsdp_matrix.errors\nfrom . import sibling\n"
        "def run(params, ctx):\n    from fsdp_matrix.standalone import main\n"
    )
    assert harness_imports(source) == [
        "6: fsdp_matrix.workload.params.flag",
        "7: fsdp_matrix.errors",
        "8: ..sibling",
        "10: fsdp_matrix.standalone.main",
    ]


@pytest.mark.parametrize("path", sorted((ROOT / "repros").glob("*.py")), ids=lambda p: p.name)
def test_repro_imports_harness_code_only_from_the_facade(path):
    # fsdp_matrix.workload.* stays importable, but a repro is the example users copy: it goes through the door
    assert harness_imports(path.read_text()) == [], f"{path.name}: import these from {FACADE}"
