"""``python -m fsdp_matrix run``: ``--env installed``, the caller's own env as the combo ``installed``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fsdp_matrix.runner import cli, factory
from tests.runner.test_session import HERE, _CountingLauncher
from tests.test_installed import fake_dist

_PEFT_ONLY_UP_TO = """
  - id: narrow
    title: a rule that covers only old peft
    report: the installed-combo issue
    repro: fault_cells.py
    grids:
      - {fault: [ok]}
    expect:
      - versions: {peft: "<0.1"}
        ok: true
        source: no installed peft is this old
"""


def _run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, argv: list) -> int:
    """``run`` on the test matrix (one extra case), its launcher a stand-in that trains every cell fine."""
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text((HERE / "fault_matrix.yaml").read_text() + _PEFT_ONLY_UP_TO)
    (tmp_path / "fault_cells.py").write_text((HERE / "fault_cells.py").read_text())
    real = factory.open_session

    def fake_session(opts, matrix, **kwargs):
        session = real(opts, matrix, **kwargs)
        session.launcher = _CountingLauncher()
        session._launchers = {(2, 1): session.launcher}
        return session

    monkeypatch.setattr(factory, "open_session", fake_session)
    return cli.main(["--matrix", str(matrix), "--results", str(tmp_path / "r"), *argv])


def test_env_installed_files_records_under_installed_with_the_checkout_commit(tmp_path, monkeypatch, capsys) -> None:
    url = "https://github.com/huggingface/peft"
    fake_dist(tmp_path / "site", "peft", "0.22.0.dev0", {"url": url, "vcs_info": {"vcs": "git", "commit_id": "d" * 40}})
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    rc = _run(tmp_path, monkeypatch, ["--env", "installed", "--cases", "healthy,narrow"])
    err = capsys.readouterr().err
    recs = [json.loads(line) for line in (tmp_path / "r" / "cells.jsonl").read_text().splitlines()]
    assert {r["combo"] for r in recs} == {"installed"} and len(recs) == 7
    assert all(r["versions"]["peft"] == "0.22.0.dev0" and r["sources"]["peft"]["commit"] == "d" * 40 for r in recs)
    assert "combo installed: " in err and "peft 0.22.0.dev0 @ ddddddd" in err
    # the one cell no rule covers says so before it runs, and fails: never a silent pass
    narrow = next(r for r in recs if r["case"] == "narrow")
    assert narrow["verdict"] == "DIFFERENT-ERROR" and rc == 1
    assert err.count("not covered: narrow/fault_ok-ws2: no rule of matrix.yaml matches it") == 1


def test_env_installed_refuses_another_combo_in_one_line(tmp_path, monkeypatch, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        _run(tmp_path, monkeypatch, ["--env", "installed", "--combo", "old"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1 and "leave out --combo old" in err
