"""Chaos for the history DB: several processes add nights at once, some of them the same night.

Each writer is a forked process running ``history add`` as the CLI does, all released together by a barrier. Whatever
the interleaving: no traceback, every exit 0 or 2 with one line per message, exactly one writer writes a night id
(the others are told it is in the DB already, or refused when their runs differ), no run is held by two nights, every
night written has all its cells, and SQLite's integrity check passes.
"""

from __future__ import annotations

import contextlib
import io
import json
import multiprocessing
import os
import sqlite3
import tempfile
import traceback
from pathlib import Path
from typing import Dict, List, Tuple

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fsdp_matrix.history import cli
from tests.history.nights import PLAN, write_night

RUNS = ("run-0", "other", "third")
"""The run id of each results dir a writer may add."""
TRACEBACK = 99
"""A writer's exit status when an exception escaped ``cli.main``."""


def _writer(barrier, args: List[str], out: str) -> None:
    """Child: wait for the others, run ``history add``, leave stdout and stderr in ``out``; exit with its status."""
    code, sink = TRACEBACK, io.StringIO()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        barrier.wait(30)
        try:
            code = cli.main(args)
        except BaseException:  # what the test looks for: nothing may escape
            traceback.print_exc()
    Path(out).write_text(sink.getvalue())
    os._exit(code)


def add_at_once(root: Path, writers: List[Tuple[str, int]]) -> List[Tuple[int, str]]:
    """Each writer (night id, results index) in its own process, released together: their (exit status, output)."""
    results = [write_night(root, 0, run=run) for run in RUNS]
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(len(writers))
    procs = []
    for n, (night, which) in enumerate(writers):
        args = ["add", str(results[which]), "--db", str(root / "history.db"), "--night", night]
        procs.append(ctx.Process(target=_writer, args=(barrier, args, str(root / f"out{n}.txt"))))
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(120)
    return [(p.exitcode, (root / f"out{n}.txt").read_text()) for n, p in enumerate(procs)]


def check_db(db: Path) -> Dict[str, List[str]]:
    """The DB is consistent; night -> its run ids."""
    con = sqlite3.connect(db)
    assert con.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    nights = {n: json.loads(runs) for n, runs in con.execute("SELECT night, run_ids FROM nights")}
    held = [r for runs in nights.values() for r in runs]
    assert len(held) == len(set(held)), f"a run in two nights: {nights}"
    for night in nights:
        assert con.execute("SELECT count(*) FROM cells WHERE night = ?", (night,)).fetchone() == (len(PLAN),)
    assert con.execute("SELECT count(*) FROM cells WHERE night NOT IN (SELECT night FROM nights)").fetchone() == (0,)
    return nights


def check_outcomes(outcomes: List[Tuple[int, str]]) -> int:
    """No traceback; exit 0 or 2; every line one of add's. The number of writers that wrote."""
    for code, text in outcomes:
        assert code in (0, 2) and "Traceback" not in text, (code, text)
        assert all(line.startswith("history add") for line in text.splitlines()), text
        assert code == 0 or "from other runs" in text, text
    return sum(1 for code, text in outcomes if code == 0 and "not written" not in text)


def test_four_writers_of_one_night_one_writes_three_are_told(tmp_path) -> None:
    outcomes = add_at_once(tmp_path, [("same", 0)] * 4)
    assert check_outcomes(outcomes) == 1
    told = [text for _, text in outcomes if "night same is in the DB already: not written again" in text]
    assert len(told) == 3, outcomes
    assert check_db(tmp_path / "history.db") == {"same": ["run-0"]}


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(["n1", "n2", "n3"]), st.integers(0, len(RUNS) - 1)), min_size=2, max_size=5))
def test_concurrent_writers_leave_a_consistent_db_and_each_is_told(writers) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        outcomes = add_at_once(root, writers)
        wrote = check_outcomes(outcomes)
        nights = check_db(root / "history.db")
        assert wrote == len(nights), (writers, outcomes, nights)
        # a night id is written by one of its writers, with that writer's runs
        for night, runs in nights.items():
            assert runs and any(n == night and RUNS[w] == runs[0] for n, w in writers)
        # a writer that exits 0 finds its runs in the DB (written, or held already); one refused (exit 2) finds its
        # night id held by other runs
        held = {r for runs in nights.values() for r in runs}
        for (night, w), (code, _) in zip(writers, outcomes):
            assert (RUNS[w] in held) if code == 0 else (nights[night] != [RUNS[w]]), (writers, outcomes, nights)
