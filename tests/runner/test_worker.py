"""The rank side: a repro that cannot be loaded is that cell's error, and repros are told apart by path."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from fsdp_matrix.cells import expand
from fsdp_matrix.matrix import parse_matrix
from fsdp_matrix.runner.launcher import Launcher
from fsdp_matrix.runner.protocol import decode_config
from fsdp_matrix.runner.session import Session
from fsdp_matrix.runner.worker import load_repro, preload

HERE = Path(__file__).resolve().parent
PINS = {"torch": "2.13.0", "peft": "0.21.2", "transformers": "5.23.0", "accelerate": "1.15.0", "bitsandbytes": "0.50.2"}


def _case(case_id: str, repro: str) -> dict:
    return {
        "id": case_id,
        "title": case_id,
        "report": "a broken repro",
        "repro": repro,
        "grids": [{"fault": ["ok"]}],
        "expect": [{"ok": True, "source": "a loadable repro trains"}],
    }


def test_a_repro_that_cannot_be_loaded_is_a_per_cell_error_naming_the_file(tmp_path):
    """A missing file, a SyntaxError and a missing ``run`` each fail their own cell, with the file's name,
    and the cells after them run in the same launch."""
    shutil.copy(HERE / "fault_cells.py", tmp_path / "fault_cells.py")
    (tmp_path / "broken_syntax.py").write_text("def run(params, ctx)\n    return {}\n")
    (tmp_path / "no_run.py").write_text("CASE = 'no-run'\n")
    matrix = parse_matrix(
        {
            "combos": [{"id": "local", "pins": PINS}],
            "cases": [
                _case("missing", "not_there.py"),
                _case("syntax", "broken_syntax.py"),
                _case("no-run", "no_run.py"),
                _case("healthy", "fault_cells.py"),
            ],
        }
    )
    launcher = Launcher(run_root=tmp_path / "launches", cell_timeout=60, python=sys.executable)
    session = Session(matrix, launcher, tmp_path / "results", {"torch": "2.13.0"}, repo_root=tmp_path)
    cells = expand(matrix)
    session.prefetch(cells)
    try:
        recs = {c.case: session.run(c) for c in cells}
    finally:
        session.close()
    for case, name, what in [
        ("missing", "not_there.py", "No such file"),
        ("syntax", "broken_syntax.py", "SyntaxError"),
        ("no-run", "no_run.py", "run"),
    ]:
        obs = recs[case].observed
        assert obs.status == "error", (case, obs)
        assert name in obs.error_message and what in obs.error_message, obs.error_message
        assert [r.status for r in obs.ranks] == ["error", "error"]
    assert recs["healthy"].verdict == "fix-holds"
    assert launcher._launches == 1  # no cell cost a relaunch


def test_repros_with_the_same_file_name_are_different_modules(tmp_path):
    """Modules were cached by file stem, so the second repro named run.py silently ran the first."""
    for who in ("a", "b"):
        (tmp_path / who).mkdir()
        (tmp_path / who / "repro.py").write_text(f"def run(params, ctx):\n    return {{'who': {who!r}}}\n")
    assert load_repro(str(tmp_path / "a" / "repro.py")).run({}, None) == {"who": "a"}
    assert load_repro(str(tmp_path / "b" / "repro.py")).run({}, None) == {"who": "b"}
    assert load_repro(str(tmp_path / "a" / "repro.py")) is load_repro(str(tmp_path / "a" / "repro.py"))


def test_warnings_raised_in_run_are_recorded_per_cell_deduplicated_and_counted():
    """A rule may expect a warning (or its absence): every cell records the warnings its run() raised, also one
    that an earlier cell of the same process raised already (Python shows a warning once per place by default)."""
    import warnings
    from types import SimpleNamespace

    from fsdp_matrix.runner.worker import run_cell

    def fn(params, ctx):
        for _ in range(3):
            warnings.warn("frozen and trainable in one unit", UserWarning, stacklevel=1)
        warnings.warn("old api", FutureWarning, stacklevel=1)
        if params.get("raise"):
            raise ValueError("after the warnings")
        return {}

    import torch  # noqa: F401 - its import adds filters of its own; they are not the cell's

    filters = list(warnings.filters)
    ctx = SimpleNamespace(seed=0)
    first, second = run_cell(fn, {}, ctx, 0), run_cell(fn, {"raise": True}, ctx, 0)
    for result in (first, second):
        got = [(w["category"], w["message"], w["count"]) for w in result.warnings]
        assert got == [("UserWarning", "frozen and trainable in one unit", 3), ("FutureWarning", "old api", 1)]
        assert all(w["filename"].endswith("test_worker.py") for w in result.warnings)
    assert second.status == "error"  # a cell that raised keeps the warnings raised before
    assert warnings.filters == filters  # the caller's filters are left as they were


def test_preload_imports_the_launchs_repros_and_leaves_a_broken_one_to_its_cell(tmp_path):
    # a launch imports what its queued repros import, no more: a toy repro must not pull in peft (about 8 s of CPU
    # per rank); one that fails to import raises nothing here, and its cell reports it (load_repro raises again)
    good = tmp_path / "good_repro.py"
    good.write_text("import json\n\ndef run(params, ctx):\n    return {}\n")
    broken = tmp_path / "broken_repro.py"
    broken.write_text("raise SystemExit('at import')\n")
    preload([str(broken), str(good)])
    assert load_repro(str(good)).__name__ in sys.modules
    loaded = [m for m in sys.modules.values() if getattr(m, "__file__", None) == str(broken.resolve())]
    assert loaded == [], "a half-run module was kept"
    with pytest.raises(SystemExit, match="at import"):
        load_repro(str(broken))


def test_a_launch_json_without_preload_reads_as_an_empty_list():
    text = (
        '{"scratch": "/s", "seed": 0, "cell_timeout": 1.0, "barrier_timeout": 1.0, "leak_budget_mb": 1,'
        ' "coordinator": 1, "coordinator_create_time": 0.0}'
    )
    assert decode_config(text).preload == []


def test_a_cell_that_ends_in_another_world_than_its_id_names_fails_whatever_it_checked():
    """Review 2026-11-28 defect 3, for every cell (one that merges or loads checks no training): a cell whose process
    group no longer has the world size its id names returned its checks from a world of its own."""
    from types import SimpleNamespace

    from torch import distributed as dist

    from fsdp_matrix.runner.worker import run_cell

    have = dist.get_world_size() if dist.is_initialized() else 1
    result = run_cell(lambda params, ctx: {"merged": True}, {}, SimpleNamespace(seed=0, world_size=have + 1), 0)
    assert result.status == "error" and result.error_type.endswith("CheckFailed"), result
    assert f"world: the process group has {have} rank" in result.error_message
    assert f"the cell's id names {have + 1}" in result.error_message
    assert run_cell(lambda params, ctx: {}, {}, SimpleNamespace(seed=0, world_size=have), 0).status == "ok"


def test_cuda_index_shares_the_gpus_only_when_asked_and_short(monkeypatch):
    import torch

    from fsdp_matrix.runner.protocol import ENV_SHARE_GPU
    from fsdp_matrix.runner.worker import cuda_index

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.delenv("NCCL_HOSTID", raising=False)
    monkeypatch.delenv(ENV_SHARE_GPU, raising=False)
    assert cuda_index(1) == 1 and "NCCL_HOSTID" not in os.environ  # not asked: NCCL's own refusal stands
    monkeypatch.setenv(ENV_SHARE_GPU, "1")
    assert cuda_index(1) == 0 and os.environ["NCCL_HOSTID"] == "fsdp-matrix-rank1"
    monkeypatch.delenv("NCCL_HOSTID")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert cuda_index(1) == 1 and "NCCL_HOSTID" not in os.environ  # a GPU per rank: nothing shared
