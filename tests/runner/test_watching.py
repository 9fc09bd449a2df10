"""Watching a launch: ``decide`` with plain data (no processes), and an End event that cannot be read is that
cell's error, never the launch's end."""

from __future__ import annotations

import copy
import signal

from fsdp_matrix.records import RankResult
from fsdp_matrix.runner.protocol import Bye, Clean, End, Hello, Ready, Start
from fsdp_matrix.runner.watching import (
    NO_STACK,
    Exited,
    Finished,
    LaunchState,
    Limits,
    Rendezvoused,
    Retire,
    Said,
    Submitted,
    decide,
)
from tests.runner.hostile import run_sequence

LIMITS = Limits(ranks=2, cell_timeout=10.0, grace_s=2.0, startup_timeout=60.0)
T0 = 1000.0


def _running(key: str = "c/x") -> LaunchState:
    """A launch whose two ranks said hello, got ready and started ``key`` at T0."""
    hello = [Said(r, Hello(pid=100 + r, rank=r, create_time=1.0, t=T0)) for r in (0, 1)]
    ready = [Said(r, Ready(pid=100 + r, t=T0)) for r in (0, 1)]
    start = [Said(r, Start(key=key, seq=0, t=T0)) for r in (0, 1)]
    state, _ = decide(LaunchState(number=3, born=T0 - 4), [Submitted(key), *hello, *ready, *start], T0, LIMITS)
    return state


def _end(rank: int, status: str = "ok", key: str = "c/x", t: float = T0 + 1) -> Said:
    result = RankResult(rank=rank, status=status, error_type="ValueError" if status == "error" else None)
    return Said(rank, End(key=key, result=result, t=t))


def _clean(rank: int, key: str = "c/x", problems=()) -> Said:
    return Said(rank, Clean(key=key, clean=not problems, problems=list(problems)))


def test_every_rank_ready_is_the_rendezvous_and_nothing_else():
    events = [Said(r, Ready(pid=1, t=T0)) for r in (0, 1)]
    state, decisions = decide(LaunchState(number=0, born=T0 - 4), events, T0, LIMITS)
    assert decisions == [Rendezvoused(4.0)]
    assert decide(state, [], T0 + 1, LIMITS)[1] == []  # said once


def test_every_rank_ended_and_clean_is_the_cell_as_the_ranks_said():
    state, decisions = decide(_running(), [_end(0), _end(1, "error"), _clean(0), _clean(1)], T0 + 2, LIMITS)
    [done] = decisions
    assert isinstance(done, Finished) and done.dump == ()
    assert done.run.status == "error" and done.run.launch == 3 and done.run.duration_s == 1.0
    assert "c/x" in state.finished
    assert decide(state, [], T0 + 100, LIMITS)[1] == []  # decided once; an idle launch that ended nothing stays


def test_decide_changes_nothing_it_is_given():
    state = _running()
    kept = copy.deepcopy(state)
    events = [_end(0), _end(1), _clean(0), _clean(1)]
    decide(state, events, T0 + 2, LIMITS)
    assert state == kept


def test_one_rank_raised_and_the_other_did_not_finish_is_an_error_with_the_others_stack():
    state, _ = decide(_running(), [_end(0, "error")], T0 + 1.5, LIMITS)
    assert decide(state, [], T0 + 2.5, LIMITS)[1] == []  # within the grace
    _, decisions = decide(state, [], T0 + 3.5, LIMITS)
    done, retire = decisions
    assert done.run.status == "error" and done.dump == (1,)
    assert [r.status for r in done.run.ranks] == ["error", "hang"] and done.run.ranks[1].stack == NO_STACK
    assert retire == Retire("rank 0 raised; the others did not finish")


def test_no_end_within_the_timeout_is_a_hang_with_every_ranks_stack():
    _, decisions = decide(_running(), [_end(0)], T0 + 10.5, LIMITS)
    done, retire = decisions
    assert done.run.status == "hang" and done.dump == (0, 1) and done.run.detect_s == 0.5
    assert isinstance(retire, Retire) and "no result within 10s" in retire.note
    state = _running()
    _, own = decide(state, [Submitted("c/y", timeout_s=1.0), Said(0, Start(key="c/y", seq=1, t=T0))], T0 + 2, LIMITS)
    assert own == []  # c/x is the running cell: c/y's own timeout waits for it


def test_a_rank_that_never_reports_clean_is_a_hang_in_the_cleanup():
    state, _ = decide(_running(), [_end(0), _end(1), _clean(0)], T0 + 2, LIMITS)
    _, decisions = decide(state, [], T0 + 1 + 12.5, LIMITS)
    done, retire = decisions
    assert done.run.status == "hang" and done.dump == (1,)
    assert "hung in the cleanup" in done.run.ranks[1].error_message and "hung in cleanup" in retire.note


def test_a_rank_that_died_is_a_crash_told_apart_from_the_rank_torchrun_stopped():
    exited = Exited(
        returncode=1,
        codes={0: -signal.SIGTERM, 1: -signal.SIGKILL},
        root=frozenset({1}),
        logs={1: ("Killed", None)},
    )
    _, decisions = decide(_running(), [exited], T0 + 3, LIMITS)
    done, retire = decisions
    assert done.run.status == "crash" and done.dump == ()
    stopped, died = done.run.ranks
    assert stopped.status == "stopped" and "after rank 1 died" in stopped.error_message
    assert died.status == "crash" and died.signal == "SIGKILL" and died.stack == "Killed"
    assert retire == Retire("torchrun exited with 1")


def test_a_rank_that_raised_before_torchrun_exited_keeps_its_error():
    exited = Exited(returncode=1, codes={1: 1}, root=frozenset({1}))
    state, _ = decide(_running(), [_end(0, "error")], T0 + 1.1, LIMITS)
    _, decisions = decide(state, [exited], T0 + 1.2, LIMITS)
    assert decisions[0].run.ranks[0].status == "error"  # its own End stands: it raised, it did not die


def test_a_clean_exit_after_every_cell_retires_with_no_note():
    state, _ = decide(_running(), [_end(0), _end(1), _clean(0), _clean(1)], T0 + 2, LIMITS)
    byes = [Said(r, Bye(why="stop")) for r in (0, 1)]
    _, decisions = decide(state, [*byes, Exited(returncode=0)], T0 + 3, LIMITS)
    assert decisions == [Retire("")]


def test_a_rank_not_clean_retires_the_launch_once_it_is_idle():
    events = [_end(0), _end(1), _clean(0, problems=["leaked a thread"]), _clean(1)]
    _, decisions = decide(_running(), events, T0 + 2, LIMITS)
    done, retire = decisions
    assert done.run.hygiene == ["leaked a thread"] and "ranks restarted" in done.run.note
    assert retire == Retire("rank 0 not clean after c/x: leaked a thread")


def test_ranks_that_never_rendezvous_retire_the_launch():
    state = LaunchState(number=0, born=T0)
    assert decide(state, [], T0 + 59, LIMITS)[1] == []
    assert decide(state, [], T0 + 61, LIMITS)[1] == [Retire("ranks did not rendezvous within 60s")]


def test_a_non_dict_return_is_that_cells_error_and_the_launch_goes_on(tmp_path):
    """``return True`` (or a list, or a dict with non-JSON keys) made the End event fail validation; that cell and
    every later one got no record and no cells.jsonl was written."""
    faults = ["probe", "ret_bool", "probe", "ret_list", "probe", "ret_bad_keys", "probe"]
    recs = run_sequence(tmp_path, faults)
    assert all(r is not None for r in recs), "a cell got no record"
    by_fault = list(zip(faults, recs))
    assert [r.verdict for f, r in by_fault if f == "probe"] == ["fix-holds"] * 4
    for fault, what in (("ret_bool", "bool"), ("ret_list", "list"), ("ret_bad_keys", "dict")):
        [rec] = [r for f, r in by_fault if f == fault]
        assert rec.observed.status == "error" and rec.verdict == "REGRESSION", rec.line
        assert "run() returned" in rec.line and what in rec.line, rec.line


def test_a_change_both_ranks_report_is_named_once_in_the_note():
    """Review 2026-11-28 (cosmetic): a cell that shrank the world to one rank changed $WORLD_SIZE on both ranks and
    $RANK on rank 1 only; the note said `$WORLD_SIZE` twice, once per rank's line."""
    head = "global state changed by the cell: "
    events = [
        _end(0),
        _end(1),
        _clean(0, problems=[head + "$WORLD_SIZE"]),
        _clean(1, problems=[head + "$RANK, $WORLD_SIZE"]),
    ]
    done, _ = decide(_running(), events, T0 + 2, LIMITS)[1]
    assert done.run.note == head + "$RANK, $WORLD_SIZE; ranks restarted before the next cell"
    assert done.run.note.count("$WORLD_SIZE") == 1
