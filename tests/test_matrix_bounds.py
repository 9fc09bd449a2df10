"""Matrix.yaml inputs that hung, ran out of memory or were silently accepted.

Each must end in one line naming the key (or the file) and a non-zero exit, quickly. The hostile files run through
``python -m fsdp_matrix validate`` in a subprocess with a wall-clock and an address-space limit, so a regression
shows up as a failed test, not as a hung or swapping test run.
"""

from __future__ import annotations

import copy
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fsdp_matrix.errors import MatrixConfigError
from fsdp_matrix.matrix import load_matrix, parse_matrix
from tests.helpers import matrix_data, write_matrix

ROOT = Path(__file__).resolve().parent.parent


def _validate(path: Path, timeout: float = 60):
    """``validate`` in a child limited to ``timeout`` seconds and 2 GiB of address space: (rc, stdout, stderr)."""

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    proc = subprocess.run(
        [sys.executable, "-m", "fsdp_matrix", "validate", str(path)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        preexec_fn=limit,
    )
    return proc.returncode, proc.stdout, proc.stderr


def merge_bomb(levels: int = 8, width: int = 9) -> str:
    """Each level merges the previous one ``width`` times: PyYAML's flatten_mapping does width**levels work."""
    lines = ["l0: &l0 {a: 1, b: 2}"]
    for i in range(1, levels + 1):
        refs = ", ".join([f"*l{i - 1}"] * width)
        lines.append(f"l{i}: &l{i} {{<<: [{refs}], k{i}: {i}}}")
    return "\n".join(lines) + "\n"


@pytest.mark.timeout(120)
def test_defect14_merge_key_bomb_is_refused_in_one_line(tmp_path):
    path = tmp_path / "bomb_merge.yaml"
    path.write_text(merge_bomb())
    rc, out, err = _validate(path)
    assert rc == 2 and out == "" and err.count("\n") == 1, (rc, out, err[-2000:])
    assert str(path) in err and "alias" in err


@pytest.mark.timeout(120)
def test_defect14_alias_bomb_in_lists_is_refused_in_one_line(tmp_path):
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    path = tmp_path / "bomb_list.yaml"
    path.write_text("\n".join(lines) + "\n")
    rc, out, err = _validate(path)
    assert rc == 2 and err.count("\n") == 1 and "alias" in err, (rc, err[-2000:])


@pytest.mark.timeout(120)
def test_defect14_an_oversized_file_is_refused_before_parsing(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_text("# " + "x" * (9 << 20) + "\n")
    rc, out, err = _validate(path)
    assert rc == 2 and err.count("\n") == 1 and "bytes" in err, (rc, err[-2000:])


def _huge(values_per_axis: int, axes: int) -> dict:
    data = matrix_data()
    grid = {"adapter": ["lora"], "model": ["llama"]}
    grid.update({f"k{i}": [f"v{j}" for j in range(values_per_axis)] for i in range(axes)})
    data["cases"][0]["grids"] = [grid]
    data["cases"][0]["requires"] = []
    data["cases"][0]["expect"] = [{"ok": True, "source": "s"}]
    return data


@pytest.mark.timeout(180)
def test_defect14_a_billion_cell_grid_is_one_line_not_a_memory_error(tmp_path):
    path = write_matrix(tmp_path, _huge(10, 9))
    rc, out, err = _validate(path, timeout=120)
    assert rc == 2 and err.count("\n") == 1 and "MemoryError" not in err, (rc, err[-2000:])
    assert "1000000000 cells" in err and "cases[0](lora-requires-grad).grids" in err


def test_defect14_a_grid_over_the_limit_is_refused_and_the_limit_is_named():
    with pytest.raises(MatrixConfigError, match=r"100000 cells .*limit 10000.*FSDP_MATRIX_MAX_CELLS"):
        parse_matrix(_huge(10, 5))


def test_defect14_the_limit_can_be_raised_for_one_run(monkeypatch):
    monkeypatch.setenv("FSDP_MATRIX_MAX_CELLS", "200000")
    assert len(parse_matrix(_huge(10, 5)).cases[0].grids[0]) == 7


def test_defect14_validate_says_the_cell_count(tmp_path, capsys):
    from fsdp_matrix.cli import main

    assert main(["validate", str(write_matrix(tmp_path, matrix_data()))]) == 0
    assert "3 cells per CPU combo" in capsys.readouterr().out


def _edit(change):
    data = matrix_data()
    change(data)
    return data


def _case(change):
    return _edit(lambda d: change(d["cases"][0]))


def _grid(change):
    return _case(lambda c: change(c["grids"][0]))


DEFECT16 = {
    "repro-absolute": (_case(lambda c: c.update(repro="/etc/passwd")), "cases[0](lora-requires-grad).repro"),
    "repro-parent": (_case(lambda c: c.update(repro="../../../../etc/passwd")), "cases[0](lora-requires-grad).repro"),
    "repro-inner-parent": (_case(lambda c: c.update(repro="repros/../../x.py")), "cases[0](lora-requires-grad).repro"),
    "extra-option": (
        _edit(lambda d: d["combos"][0].update(extra=["--index-url=http://evil"])),
        "combos[0](current).extra[0]",
    ),
    "extra-short-option": (
        _edit(lambda d: d["combos"][0].update(extra=["numpy<2", "-e /etc"])),
        "combos[0](current).extra[1]",
    ),
    "extra-not-pep508": (_edit(lambda d: d["combos"][0].update(extra=["numpy <<< 2"])), "combos[0](current).extra[0]"),
    "python-not-a-version": (
        _edit(lambda d: d["combos"][0].update(python="2.7; rm -rf /")),
        "combos[0](current).python",
    ),
    "value-slash": (_grid(lambda g: g.update(model=["lora/x"])), "cases[0](lora-requires-grad).grids[0].model"),
    "value-dotdot-slash": (
        _grid(lambda g: g.update(model=["../../tmp"])),
        "cases[0](lora-requires-grad).grids[0].model",
    ),
    "value-newline": (_grid(lambda g: g.update(model=["lla\nma"])), "cases[0](lora-requires-grad).grids[0].model"),
    "value-space": (_grid(lambda g: g.update(model=["lla ma"])), "cases[0](lora-requires-grad).grids[0].model"),
    "value-empty": (_grid(lambda g: g.update(model=[""])), "cases[0](lora-requires-grad).grids[0].model"),
    "axis-name-not-identifier": (
        _grid(lambda g: g.update({"a b/c": ["x"]})),
        "cases[0](lora-requires-grad).grids[0]",
    ),
    "values-collide-in-id": (_grid(lambda g: g.update(orig=[1, True])), "cases[0](lora-requires-grad).grids[0].orig"),
    "values-collide-across-grids": (
        # 1 and "1" are different values (a `when` tells them apart) with one cell id, orig1
        _case(lambda c: c["grids"][1].update(orig=["1"])),
        "cases[0](lora-requires-grad).grids[1].orig",
    ),
    "min-world-size-negative": (
        _case(lambda c: c["requires"][0].update(min_world_size=-1)),
        "cases[0](lora-requires-grad).requires[0].min_world_size",
    ),
    "min-world-size-zero": (
        _case(lambda c: c["requires"][0].update(min_world_size=0)),
        "cases[0](lora-requires-grad).requires[0].min_world_size",
    ),
    "empty-grid": (_case(lambda c: c["grids"].append({})), "cases[0](lora-requires-grad).grids[2]: an empty grid"),
    # a NUL passed validate, then ended `nox -s "matrix(badnul)"` in ValueError: embedded null byte
    "sources-nul": (
        _edit(lambda d: d["combos"][0].update(sources={"peft": "git+file:///x\0@main"})),
        "combos[0](current).sources",
    ),
    "sources-newline": (
        _edit(lambda d: d["combos"][0].update(sources={"peft": "git+file:///x\n@main"})),
        "combos[0](current).sources",
    ),
    # true read as a one-second hang timeout
    "hang-timeout-bool": (
        _case(lambda c: c["expect"][0].update(error=None, hang={"timeout_s": True}) or c["expect"][0].pop("error")),
        "timeout_s",
    ),
}


@pytest.mark.parametrize("name", sorted(DEFECT16))
def test_defect16_matrix_rejects_in_one_line_naming_the_key(tmp_path, capsys, name):
    from fsdp_matrix.cli import main

    data, key = DEFECT16[name]
    path = write_matrix(tmp_path, copy.deepcopy(data))
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert key in err and err.count("\n") == 1, err


def test_defect16_repro_may_not_leave_the_repo_by_a_link(tmp_path):
    path = write_matrix(tmp_path, matrix_data())
    outside = tmp_path.parent / f"{tmp_path.name}-outside.py"
    outside.write_text("CASE = 'x'\n")
    link = tmp_path / "repros" / "lora_requires_grad.py"
    link.unlink()
    link.symlink_to(outside)
    with pytest.raises(MatrixConfigError, match=r"cases\[0\]\(lora-requires-grad\)\.repro: .*outside"):
        load_matrix(path)


def test_defect16_the_repo_matrix_still_loads():
    m = load_matrix()
    assert yaml.safe_load((ROOT / "matrix.yaml").read_text())["cases"][0]["id"] == m.cases[0].id
