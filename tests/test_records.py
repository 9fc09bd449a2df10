import json
import multiprocessing

import pytest

from fsdp_matrix import records
from fsdp_matrix.records import Observed, RankResult, Record


def _record(cell="c1", combo="current", verdict="fix-holds", t=1.0):
    return Record(
        case="case",
        cell=cell,
        params={"orig": 1},
        versions={"torch": "2.13.0+cpu", "peft": "0.21.2"},
        device="cpu",
        world_size=2,
        expected={"kind": "ok"},
        observed=Observed(
            status="ok",
            checks={"losses": [1.0]},
            ranks=[RankResult(rank=0, status="ok"), RankResult(rank=1, status="ok")],
        ),
        verdict=verdict,
        duration_s=0.5,
        combo=combo,
        finished_at=t,
    )


def test_round_trip(tmp_path):
    records.append(tmp_path, _record())
    [back] = list(records.iter_records(tmp_path))
    assert back == _record()
    line = json.loads((tmp_path / "cells.jsonl").read_text())
    for key in (
        "case",
        "cell",
        "params",
        "versions",
        "device",
        "world_size",
        "expected",
        "observed",
        "verdict",
        "duration_s",
    ):
        assert key in line
    assert set(line["observed"]) >= {"status", "error_type", "error_message", "location", "checks"}


def test_torn_last_line_is_skipped_but_corruption_inside_is_an_error(tmp_path):
    records.append(tmp_path, _record("a"))
    with open(tmp_path / "cells.jsonl", "a") as fh:
        fh.write('{"case": "case", "cell": "b", "par')  # killed mid-write
    assert [r.cell for r in records.iter_records(tmp_path)] == ["a"]
    with open(tmp_path / "cells.jsonl", "a") as fh:
        fh.write("\nnot json\n")
    with pytest.raises(ValueError, match=r"cells.jsonl:2: not a cell record"):
        list(records.iter_records(tmp_path))


def test_latest_keeps_newest_per_combo_and_cell(tmp_path):
    for rec in (_record("a", t=1), _record("a", verdict="REGRESSION", t=2), _record("a", combo="old", t=3)):
        records.append(tmp_path, rec)
    latest = records.latest(records.iter_records(tmp_path))
    assert latest[("current", "case/a")].verdict == "REGRESSION"
    assert len(latest) == 2


def _writer(path, n, tag):
    for i in range(n):
        rec = _record(f"{tag}-{i}")
        rec.observed.ranks[0].traceback = "x" * 100_000  # large lines would interleave without the lock
        records.append(path, rec)


def test_concurrent_appends_never_interleave(tmp_path):
    procs = [multiprocessing.Process(target=_writer, args=(tmp_path, 20, t)) for t in "abcd"]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    cells = [r.cell for r in records.iter_records(tmp_path)]
    assert sorted(cells) == sorted(f"{t}-{i}" for t in "abcd" for i in range(20))
