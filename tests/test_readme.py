"""The README is the front door, and its figures are read from matrix.yaml, so they cannot drift from it unnoticed.

The figures about the matrix (the counts, the cases table in docs/pages/cases.md, the timings' "N combos x M cells")
are checked wherever README.md or the manual quote them; the README's example case is checked as a case; every link
of the README reaches a file and heading that exist; and CI runs the README's test command. The commands shown in
README.md and docs/ are checked by tests/test_docs.py.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import yaml

from fsdp_matrix import case as facade
from fsdp_matrix.cells import expand, expand_case
from fsdp_matrix.matrix import load_matrix, parse_matrix

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
CASES_PAGE = (ROOT / "docs" / "pages" / "cases.md").read_text()
DOCS = {p: p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]}
MATRIX = load_matrix(ROOT / "matrix.yaml")
README_LIMIT = 20_000
"""Bytes: the README is read in one sitting; everything else has a page under docs/."""

ROWS = re.findall(r"^\| `([a-z0-9-]+)` \| ([^|]+) \|", CASES_PAGE, re.M)


def _section(title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", README, re.M | re.S)
    assert match, f"README has no section '## {title}'"
    return match.group(1)


def _tagged(tag: str) -> int:
    return sum(tag in combo.tags for combo in MATRIX.combos)


def test_readme_is_short():
    assert len(README.encode()) <= README_LIMIT, f"README.md is {len(README.encode())} bytes: move detail to docs/"


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


def _counts(text: str):
    return re.findall(r"(\d+) cases, (\d+) cells per CPU combo \((\d+) ranks\), (\d+) CPU combos", text)


@pytest.mark.parametrize("page", ["README.md", "docs/pages/cases.md"])
def test_counts_match_matrix_yaml(page):
    text = (ROOT / page).read_text()
    found = _counts(text)
    assert found, f"{page}: the 'N cases, M cells per CPU combo (2 ranks), K CPU combos' line is gone"
    for cases, cells, ranks, cpu in (map(int, f) for f in found):
        assert cases == len(MATRIX.cases)
        assert cells == len(expand(MATRIX, world_size=ranks))
        assert cpu == _tagged("cpu")
    torch_axis = re.findall(r"(\d+) torch-axis combos", text)
    assert torch_axis and {int(n) for n in torch_axis} == {_tagged("torch")}


def test_every_combos_times_cells_figure_matches():
    # timings quote "13 CPU combos x 202 cells" and "all 202 cells on each of the 12 combos"
    for text in DOCS.values():
        for combos, cells in re.findall(r"(\d+) CPU combos x (\d+) cells", text):
            assert (int(combos), int(cells)) == (_tagged("cpu"), len(expand(MATRIX)))
        for cells, combos in re.findall(r"all (\d+) cells on each of the (\d+) combos", text):
            assert (int(cells), int(combos)) == (len(expand(MATRIX)), _tagged("torch"))


def test_readme_shows_the_two_commands_and_ci_runs_the_test_command():
    block = re.search(r"```bash\n(.*?)```", _section("The two commands"), re.S).group(1)
    commands = [line.split("#")[0].strip() for line in block.splitlines()]
    assert "python -m pip install 'nox[uv]' && nox -s matrix" in commands
    assert "python -m pip install 'nox[uv]' && nox -s tests" in commands
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert ci[-2:] == ["python -m pip install 'nox[uv]'", "nox -s tests"], ".ci/run no longer runs the README's command"


def test_readme_names_the_case_facade():
    assert "fsdp_matrix.case" in _section("Adding a case")


def _readme_block(lang: str) -> str:
    recipe = _section("Adding a case")
    match = re.search(rf"^( *)```{lang}\n(.*?)^\1```", recipe, re.M | re.S)
    assert match, f"the recipe has no {lang} block"
    return re.sub(rf"^{match.group(1)}", "", match.group(2), flags=re.M)


def test_readme_example_repro_imports_only_the_facade():
    tree = ast.parse(_readme_block("python"))
    imports = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert imports and all(isinstance(n, ast.ImportFrom) and n.module == "fsdp_matrix.case" for n in imports)
    names = {alias.name for n in imports for alias in n.names}
    assert names <= set(facade.__all__), f"not in fsdp_matrix.case: {names - set(facade.__all__)}"
    assert {"CASE", "run"} <= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets} | {
        n.name for n in tree.body if isinstance(n, ast.FunctionDef)
    }


def test_readme_example_case_is_a_valid_case_and_its_explain_id_is_one_of_its_cells():
    entry = yaml.safe_load(_readme_block("yaml"))
    data = yaml.safe_load((ROOT / "matrix.yaml").read_text())
    if entry[0]["id"] not in {c["id"] for c in data["cases"]}:  # the toy-case test's copy already holds it
        data["cases"] += entry
    example = parse_matrix(data).case(entry[0]["id"])
    ids = {f"{example.id}/{cell.id}" for cell in expand_case(example)}
    shown = re.findall(rf"explain ({re.escape(example.id)}/\S+)", _section("Adding a case"))
    assert shown and set(shown) <= ids, f"{shown} not among the example's cells {sorted(ids)}"


def _slug(heading: str) -> str:
    # Python-Markdown's toc slugify, as mkdocs writes heading ids
    text = re.sub(r"[^\w\s-]", "", heading.replace("`", "")).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


LINKS = re.findall(r"\]\(([^)#\s]+)(?:#([^)\s]+))?\)", README)


@pytest.mark.parametrize("target,anchor", [link for link in LINKS if "://" not in link[0]], ids=str)
def test_readme_link_reaches_a_file_and_heading(target, anchor):
    path = ROOT / target
    assert path.is_file(), f"README links to {target}, which does not exist"
    if anchor:
        headings = re.findall(r"^#+ (.+)$", path.read_text(), re.M)
        assert anchor in {_slug(h) for h in headings}, f"{target} has no heading #{anchor}"


def test_every_page_is_in_the_site():
    # mkdocs builds only docs_dir (docs/pages): a page elsewhere under docs/ would be missing from the site
    pages = ROOT / "docs" / "pages"
    assert pages / "index.md" in DOCS
    strays = [str(p.relative_to(ROOT)) for p in DOCS if p.parent != ROOT and pages not in p.parents]
    assert strays == [], f"move these under docs/pages/ so that mkdocs builds them: {strays}"


def test_the_generated_figures_are_current():
    # the counts and the cases table are written by one command; a new case only has to run it
    from fsdp_matrix.pages import stale, stale_message

    behind = stale(ROOT, MATRIX)
    assert not behind, stale_message(behind)


def test_the_generator_keeps_written_rows_adds_new_cases_and_drops_removed_ones():
    from fsdp_matrix.pages import cases_table, counts, upstream

    data = yaml.safe_load((ROOT / "matrix.yaml").read_text())
    toy = yaml.safe_load(_readme_block("yaml"))
    data["cases"] = [c for c in data["cases"][1:] if c["id"] != "my-bug"] + toy  # the toy copy holds it already
    matrix = parse_matrix(data)
    table = cases_table(CASES_PAGE, matrix)
    assert f"| `{data['cases'][0]['id']}` |" in table and "| `lora-requires-grad` |" not in table
    assert "| `my-bug` | peft#1234 | One line on what breaks |" in table
    assert ROWS[1][1] in table  # a written row is kept as written
    assert f"{len(matrix.cases)} cases" in counts(README, matrix)
    assert upstream("https://github.com/huggingface/accelerate/pull/3762 (1.11.0)") == "accelerate PR #3762"


CHECKS = [
    "tests/test_readme.py",
    "tests/test_docs.py",
    "tests/test_repro_contract.py",
    "tests/test_evidence.py",
    "tests/test_matrix_layout.py",
    "tests/test_expectations.py",
    "tests/test_platform.py",
    "tests/test_cells.py",
    "tests/test_lint.py",
    "tests/workload/test_params.py",
]
"""The checks `nox -s tests` runs on matrix.yaml, the docs and the repros (a new case's cells run in its own run)."""


def _copy_of_the_repo(dest: Path) -> Path:
    import shutil
    import subprocess

    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    for name in listed.stdout.splitlines():
        if (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    return dest


def test_a_case_added_as_the_readme_says_keeps_the_checks_green(tmp_path):
    """A newcomer's case, written exactly as "Adding a case" says (one repro through the facade, one matrix.yaml
    entry like the README's, the commands of step 3), failed 6 tests of `nox -s tests`: the cases table, both
    counts, the expectations snapshot, "every rule has an id" and a params rule no page stated."""
    import subprocess
    import sys

    repo = _copy_of_the_repo(tmp_path / "repo")
    (repo / "repros" / "my_bug.py").write_text(_readme_block("python"))
    entry = re.sub(r"^", "  ", _readme_block("yaml"), flags=re.M)
    (repo / "matrix.yaml").write_text((repo / "matrix.yaml").read_text() + entry)
    env = {**__import__("os").environ, "PYTHONPATH": str(repo)}
    for step in (["docs", "--write", "--root", str(repo)], ["validate"]):  # step 3's commands that need no run
        done = subprocess.run([sys.executable, "-m", "fsdp_matrix", *step], cwd=repo, env=env, capture_output=True)
        assert done.returncode == 0, done.stderr.decode()
    me = "tests/test_readme.py::test_a_case_added_as_the_readme_says_keeps_the_checks_green"
    cmd = [sys.executable, "-m", "pytest", *CHECKS, "-q", "-x", "-n", "0", "-p", "no:cacheprovider", "--deselect", me]
    done = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "passed" in done.stdout
