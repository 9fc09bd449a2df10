import json
import multiprocessing
import os

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


def test_torn_last_line_is_skipped_and_counted(tmp_path):
    records.append(tmp_path, _record("a"))
    with open(tmp_path / "cells.jsonl", "a") as fh:
        fh.write('{"case": "case", "cell": "b", "par')  # killed mid-write
    skipped = []
    assert [r.cell for r in records.iter_records(tmp_path, skipped)] == ["a"]
    assert [(s.line, s.torn) for s in skipped] == [(2, True)]


def test_append_after_a_torn_line_starts_a_new_line(tmp_path):
    """A resume (or a concurrent run) appending after a killed writer's fragment is not glued onto it."""
    records.append(tmp_path, _record("a"))
    with open(tmp_path / "cells.jsonl", "a") as fh:
        fh.write('{"case": "case", "cell": "b", "par')  # killed mid-write
    records.append(tmp_path, _record("c"))
    assert [r.cell for r in records.iter_records(tmp_path)] == ["a", "c"]
    skipped = []
    list(records.iter_records(tmp_path, skipped))
    assert [s.line for s in skipped] == [2]  # the fragment is its own (skipped, counted) line


def _line(**changes):
    data = _record("bad").to_json()
    for dotted, value in changes.items():
        node = data
        *path, last = dotted.split(".")
        for part in path:
            node = node[int(part)] if part.isdigit() else node[part]
        node[last] = value
    return json.dumps(data)


@pytest.mark.parametrize(
    "changes,where",
    [
        ({"duration_s": "fast"}, "duration_s"),
        ({"finished_at": "yesterday"}, "finished_at"),
        ({"versions": ["torch", "2.13.0"]}, "versions"),
        ({"observed.ranks.0.rank": "zero"}, "observed.ranks.0.rank"),
        ({"observed": None}, "observed"),
    ],
)
def test_wrong_typed_line_is_skipped_counted_and_reading_goes_on(tmp_path, changes, where):
    """One bad line costs that line, named with its file, number and field, never the whole file."""
    records.append(tmp_path, _record("a"))
    with open(tmp_path / "cells.jsonl", "a") as fh:
        fh.write(_line(**changes) + "\n")
    records.append(tmp_path, _record("c"))
    assert [r.cell for r in records.iter_records(tmp_path)] == ["a", "c"]
    skipped = []
    list(records.iter_records(tmp_path, skipped))
    [bad] = skipped
    assert bad.line == 2 and not bad.torn and where in bad.reason and bad.file.name == "cells.jsonl"


def test_unknown_fields_inside_observed_and_ranks_are_ignored(tmp_path):
    """A newer harness may add fields anywhere; an older reader reads the rest."""
    with open(tmp_path / "cells.jsonl", "w") as fh:
        fh.write(_line(**{"observed.new_thing": 1, "observed.ranks.1.gpu_mem": 3, "top_level_new": "x"}) + "\n")
    [rec] = list(records.iter_records(tmp_path))
    assert rec.observed.ranks[1].status == "ok"
    skipped = []
    list(records.iter_records(tmp_path, skipped))
    assert skipped == []


def test_records_of_a_newer_schema_are_read_and_counted_in_one_line(tmp_path, capsys):
    """Records written by a newer harness (schema 99, fields this reader does not know) were read without a word:
    they are read, and one line says how many are newer than this reader."""
    with open(tmp_path / "cells.jsonl", "w") as fh:
        for n in range(3):
            fh.write(_line(schema=99, top_level_new=n) + "\n")
        fh.write(_line() + "\n")
    assert len(list(records.iter_records(tmp_path))) == 4
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "3 records" in err[0] and "schema 99" in err[0], err
    assert f"schema {records.SCHEMA}" in err[0] and "cells.jsonl" in err[0]


def test_a_record_written_with_megabytes_of_text_reads_back_clipped(tmp_path):
    """A line holding a 4 MB error message (in the message, each rank's traceback and the verdict line; not written
    by this harness, which clips before writing) went whole into report.json, report.html and the JUnit file
    (100 MB of message gave 100, 100 and 300 MB, 2 GB of memory): a reader clips it as the writer does."""
    big = "m" * 4_000_000
    with open(tmp_path / "cells.jsonl", "w") as fh:
        fh.write(_line(**{"line": big, "observed.error_message": big, "observed.ranks.0.traceback": big}) + "\n")
    [rec] = list(records.iter_records(tmp_path))
    assert len(rec.line) <= records.MESSAGE_CHARS + 100 and rec.line.startswith("mmm") and rec.line.endswith("mmm")
    assert len(rec.observed.error_message) <= records.MESSAGE_CHARS + 100
    assert len(rec.observed.ranks[0].traceback) <= records.TEXT_CHARS + 100


def test_unread_lines_are_reported_when_the_caller_does_not_collect_them(tmp_path, capsys):
    with open(tmp_path / "cells.jsonl", "w") as fh:
        fh.write(_line(duration_s="fast") + "\n")
    assert list(records.iter_records(tmp_path)) == []
    assert "cells.jsonl:1: skipped" in capsys.readouterr().err


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


def test_schema_4_records_each_ranks_warnings_and_older_records_read_without_them(tmp_path):
    warned = {"category": "UserWarning", "message": "m", "filename": "f.py", "lineno": 3, "count": 2}
    rec = _record()
    rec.observed.ranks[0].warnings = [warned]
    records.append(tmp_path, rec)
    line = json.loads((tmp_path / "cells.jsonl").read_text())
    assert line["schema"] == records.SCHEMA and line["observed"]["ranks"][0]["warnings"] == [warned]
    del line["observed"]["ranks"][0]["warnings"]
    line["schema"] = 3
    (tmp_path / "old.jsonl").write_text(json.dumps(line) + "\n")
    [old] = list(records.iter_records(tmp_path / "old.jsonl"))
    assert old.observed.ranks[0].warnings == [] and old.schema == 3


def test_schema_5_records_a_flips_confirmation_and_older_records_read_without_one(tmp_path):
    assert records.SCHEMA >= 5
    rec = _record()
    rec.confirmation = records.Confirmation(status="flaky", previous="fix-holds", reruns=["fix-holds", "fix-holds"])
    records.append(tmp_path, rec)
    line = json.loads((tmp_path / "cells.jsonl").read_text())
    assert line["schema"] == records.SCHEMA and line["confirmation"]["status"] == "flaky"
    [back] = list(records.iter_records(tmp_path / "cells.jsonl"))
    assert back.confirmation == rec.confirmation
    del line["confirmation"]
    line["schema"] = 4
    (tmp_path / "old.jsonl").write_text(json.dumps(line) + "\n")
    [old] = list(records.iter_records(tmp_path / "old.jsonl"))
    assert old.confirmation is None and old.schema == 4


def test_schema_6_records_the_harness_and_requirements_and_older_records_read_without_them(tmp_path):
    assert records.SCHEMA == 6
    rec = _record()
    rec.harness, rec.requires = "6-0123456789ab", [{"device": "cuda", "reason": "needs a GPU"}]
    records.append(tmp_path, rec)
    line = json.loads((tmp_path / "cells.jsonl").read_text())
    assert (line["schema"], line["harness"], line["requires"]) == (6, rec.harness, rec.requires)
    del line["harness"], line["requires"]
    line["schema"] = 5
    (tmp_path / "old.jsonl").write_text(json.dumps(line) + "\n")
    [old] = list(records.iter_records(tmp_path / "old.jsonl"))
    assert (old.harness, old.requires, old.schema) == ("", [], 5)


def test_a_record_holds_the_global_world_size_and_the_node_count(tmp_path):
    from dataclasses import replace

    records.append(tmp_path, replace(_record(cell="c-ws4-n2"), world_size=4, nodes=2))
    line = json.loads((tmp_path / "cells.jsonl").read_text())
    assert (line["world_size"], line["nodes"], line["schema"]) == (4, 2, records.SCHEMA)


def test_a_schema_3_record_without_nodes_ran_on_one_node(tmp_path):
    data = _record().to_json()
    del data["nodes"]
    data["schema"] = 3
    (tmp_path / "cells.jsonl").write_text(json.dumps(data) + "\n")
    [back] = list(records.iter_records(tmp_path))
    assert (back.world_size, back.nodes, back.schema) == (2, 1, 3)


def test_a_message_holding_a_surrogate_escaped_byte_reads_back(tmp_path):
    """A path with a non-UTF-8 byte, as os.fsdecode returns it, is kept as ``\\xff`` text: the record reads back."""
    message = "cannot load adapter from " + os.fsdecode(b"/data/dir-\xff/adapter")
    rec = _record("sur")
    rec.observed = Observed(status="error", error_type="RuntimeError", error_message=message, ranks=[])
    rec.params = {os.fsdecode(b"k\xfe"): os.fsdecode(b"v\xfd")}
    records.append(tmp_path, rec)
    records.append(tmp_path, _record("after"))
    skipped = []
    back = list(records.iter_records(tmp_path, skipped))
    assert skipped == [] and [r.cell for r in back] == ["sur", "after"]
    assert back[0].observed.error_message == "cannot load adapter from /data/dir-\\xff/adapter"
    assert back[0].params == {"k\\xfe": "v\\xfd"}


def test_a_line_written_by_an_older_harness_with_a_lone_surrogate_reads_back(tmp_path):
    """json.dumps escapes a lone surrogate as ``\\udcff``, which pydantic's JSON parser refuses: the record is
    recovered rather than lost."""
    data = _record("old").to_json()
    data["observed"]["error_message"] = "dir-\udcff"
    (tmp_path / "cells.jsonl").write_text(json.dumps(data) + "\n")
    skipped = []
    [back] = list(records.iter_records(tmp_path, skipped))
    assert skipped == [] and back.observed.error_message == "dir-\\xff"
