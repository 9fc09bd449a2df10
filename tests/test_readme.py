"""The README's figures about the matrix are read from matrix.yaml, so they cannot drift from it unnoticed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fsdp_matrix.cells import expand
from fsdp_matrix.matrix import load_matrix

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
MATRIX = load_matrix(ROOT / "matrix.yaml")


def _section(title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## )", README, re.M | re.S)
    assert match, f"README has no section '## {title}'"
    return match.group(1)


COVERS = _section("What it covers")
ROWS = re.findall(r"^\| `([a-z0-9-]+)` \| ([^|]+) \|", COVERS, re.M)


def _tagged(tag: str) -> int:
    return sum(tag in combo.tags for combo in MATRIX.combos)


def test_cases_table_lists_every_case_once():
    listed = [case_id for case_id, _ in ROWS]
    assert len(listed) == len(set(listed)), "a case listed twice"
    assert sorted(listed) == sorted(case.id for case in MATRIX.cases)


@pytest.mark.parametrize("case_id,upstream", ROWS, ids=[r[0] for r in ROWS])
def test_cases_table_cites_the_cases_own_report(case_id, upstream):
    numbers = re.findall(r"#(\d+)", upstream)
    assert numbers, f"{case_id}: no upstream issue or PR number in {upstream!r}"
    report = MATRIX.case(case_id).report
    assert [n for n in numbers if n not in report] == [], f"{case_id}: {upstream!r} vs matrix.yaml report {report!r}"


def test_counts_match_matrix_yaml():
    match = re.search(r"(\d+) cases, (\d+) cells per CPU combo \((\d+) ranks\), (\d+) CPU combos", COVERS)
    assert match, "the 'N cases, M cells per CPU combo (2 ranks), K CPU combos' line is gone"
    cases, cells, ranks, cpu = map(int, match.groups())
    assert cases == len(MATRIX.cases)
    assert cells == len(expand(MATRIX, world_size=ranks))
    assert cpu == _tagged("cpu")
    torch_axis = re.search(r"(\d+) torch-axis combos", COVERS)
    assert torch_axis and int(torch_axis.group(1)) == _tagged("torch")


def test_every_combos_times_cells_figure_matches():
    # timings elsewhere quote "13 CPU combos x 202 cells" and "all 202 cells on each of the 12 combos"
    for combos, cells in re.findall(r"(\d+) CPU combos x (\d+) cells", README):
        assert (int(combos), int(cells)) == (_tagged("cpu"), len(expand(MATRIX)))
    for cells, combos in re.findall(r"all (\d+) cells on each of the (\d+) combos", README):
        assert (int(cells), int(combos)) == (len(expand(MATRIX)), _tagged("torch"))


def test_readme_names_the_case_facade():
    assert "fsdp_matrix.case" in _section("Adding a case from a new bug report")
