"""Watching a launch, as a decision: what the ranks and torchrun said in, what to do about it out.

``decide(state, events, now, limits)`` reads nothing, signals nothing and writes nothing: it folds the events into a
new ``LaunchState`` and returns the decisions, which the Launcher (launcher.py) carries out. A cell ends in one of
these ways, and each has one place here:

- every rank reported End and then Clean: ok or error, as the ranks said (``_reported``);
- a rank raised and the others did not finish within ``grace_s``: error, with the others' stacks (``_stuck``);
- no End from some rank within the cell's timeout: hang, with every rank's stack (``_stuck``);
- every rank reported End, but one never reported Clean within the timeout (+ ``grace_s``): hang in the cleanup
  after the cell, with that rank's stack (``_stuck_in_cleanup``);
- torchrun exited: a rank died. The rank that died speaks for the cell with its exit code or signal, whether it died
  in the cell or in the cleanup after it (``_died``).

A rank that raised is apart from a rank that died, as in torchrunx (``ExceptionFromWorker`` vs
``WorkerFailedError``, https://github.com/apoorvkh/torchrunx): the first reported its error and the cell is
``error``; the second said nothing, torchrun tells how it went, and the cell is ``crash``.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field, replace
from typing import Dict, FrozenSet, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from fsdp_matrix.records import RankResult
from fsdp_matrix.runner import procs
from fsdp_matrix.runner.protocol import Bye, Clean, End, Event, Hello, Ready, Start

NO_STACK = "(no stack dumped)"
"""A stuck rank's stack when none could be dumped."""


@dataclass(kw_only=True)
class CellRun:
    """What the launcher observed for one cell, before it is judged."""

    key: str
    """``case/cell``."""
    status: str
    """ok / error / hang / crash / env-error."""
    ranks: List[RankResult]
    """Per-rank results, with stacks (hang) and exit codes (crash)."""
    duration_s: float
    """From the first rank's start to the last rank's end (or to detection)."""
    launch: int = 0
    """Which launch ran it (0, 1, ... as launches are replaced)."""
    detect_s: Optional[float] = None
    """For hang/crash/one-rank errors: seconds from the first sign of trouble to the verdict."""
    note: str = ""
    """Why the launch was replaced after this cell, if it was."""
    hygiene: List[str] = field(default_factory=list)
    """Problems a rank found after the cell (leaked modules, child processes, broken group): the launch was replaced."""
    env_removed: List[str] = field(default_factory=list)
    """The caller's variables the launch's ranks were started without (protocol.STRIPPED_ENV_PREFIXES)."""


# ---- events in ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Said:
    """A rank's event, read from its events file."""

    rank: int
    """The rank's slot: node x ranks per node + local rank."""
    event: Event
    """What it said."""


@dataclass(frozen=True)
class Submitted:
    """The Launcher handed a cell to the launch."""

    key: str
    """``case/cell``."""
    timeout_s: Optional[float] = None
    """The cell's own timeout (a rule that expects a hang); None: the launcher's ``cell_timeout``."""


@dataclass(frozen=True)
class Exited:
    """Some node's torchrun has exited, and what its summary and the ranks' logs say."""

    returncode: Optional[int]
    """The first non-zero exit code of the agents that exited, else 0 when all did, else None."""
    codes: Mapping[int, int] = field(default_factory=dict)
    """Slot -> exit code, for the ranks torchrun's summary lists as failed."""
    root: FrozenSet[int] = frozenset()
    """Slots torchrun names as the root cause."""
    running: Mapping[int, int] = field(default_factory=dict)
    """Slot -> node, for the ranks whose node's torchrun is still up."""
    logs: Mapping[int, Tuple[str, Optional[str]]] = field(default_factory=dict)
    """Slot -> (its stderr, its error file's traceback)."""


WatchEvent = Union[Said, Submitted, Exited]


@dataclass(frozen=True)
class Limits:
    """The launcher's settings that deciding reads (read at each poll: a caller may change them between cells)."""

    ranks: int
    """Ranks the launch runs: world_size on each of the launcher's nodes."""
    cell_timeout: float
    """Seconds a cell may run before it is a hang (unless it has its own timeout)."""
    grace_s: float
    """After one rank raised, how long the others get to finish."""
    startup_timeout: float
    """Seconds for every rank to import, rendezvous and report ready."""


@dataclass(frozen=True)
class LaunchState:
    """What one launch's events have said so far. Never changed in place: ``decide`` returns a new one."""

    number: int
    """Which launch (0, 1, ... as launches are replaced)."""
    born: float
    """Wall-clock time torchrun was started."""
    env_removed: Tuple[str, ...] = ()
    """The caller's variables its ranks were started without."""
    submitted: Tuple[str, ...] = ()
    """Cells handed to it, in order."""
    timeouts: Mapping[str, float] = field(default_factory=dict)
    """Cells with a timeout of their own; the others use the launcher's ``cell_timeout``."""
    pids: Mapping[int, Tuple[int, float]] = field(default_factory=dict)
    """rank -> (pid, create time) from its Hello: names the process, not just whoever holds the pid later."""
    ready: FrozenSet[int] = frozenset()
    """Ranks that reported Ready."""
    byes: FrozenSet[int] = frozenset()
    """Ranks that said goodbye."""
    started: Mapping[str, Mapping[int, float]] = field(default_factory=dict)
    """cell -> rank -> when it started the cell."""
    ended: Mapping[str, Mapping[int, RankResult]] = field(default_factory=dict)
    """cell -> rank -> its result."""
    end_t: Mapping[str, float] = field(default_factory=dict)
    """cell -> the latest End's time."""
    clean: Mapping[str, Mapping[int, Tuple[str, ...]]] = field(default_factory=dict)
    """cell -> rank -> problems it found after the cell (empty: clean)."""
    retiring: Optional[str] = None
    """Why the launch must end once idle (a rank not clean, or one that asked to go); None: it goes on."""
    finished: FrozenSet[str] = frozenset()
    """Cells decided."""


# ---- decisions out ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Finished:
    """A cell is decided."""

    key: str
    """``case/cell``."""
    run: CellRun
    """What was observed."""
    dump: Tuple[int, ...] = ()
    """Ranks whose stack the Launcher dumps into their result (``NO_STACK`` where none comes) before it goes on."""


@dataclass(frozen=True)
class Retire:
    """End the launch, and re-queue every cell it did not finish."""

    note: str
    """Why; empty when it ended cleanly by itself."""


@dataclass(frozen=True)
class Rendezvoused:
    """Every rank reported Ready."""

    seconds: float
    """From starting torchrun to the last Ready (imports + rendezvous)."""


Decision = Union[Finished, Retire, Rendezvoused]


# ---- folding events -----------------------------------------------------------------------------------------------
def _put(table: Mapping, key: object, value: object) -> Dict:
    return {**table, key: value}


def _said(state: LaunchState, rank: int, ev: Event) -> LaunchState:
    if isinstance(ev, Hello):
        return replace(state, pids=_put(state.pids, rank, (ev.pid, ev.create_time)))
    if isinstance(ev, Ready):
        return replace(state, ready=state.ready | {rank})
    if isinstance(ev, Start):
        return replace(state, started=_put(state.started, ev.key, _put(state.started.get(ev.key, {}), rank, ev.t)))
    if isinstance(ev, End):
        ended = _put(state.ended, ev.key, _put(state.ended.get(ev.key, {}), rank, ev.result))
        return replace(state, ended=ended, end_t=_put(state.end_t, ev.key, max(state.end_t.get(ev.key, 0.0), ev.t)))
    if isinstance(ev, Clean):
        clean = _put(state.clean, ev.key, _put(state.clean.get(ev.key, {}), rank, tuple(ev.problems)))
        why = f"rank {rank} not clean after {ev.key}: " + "; ".join(ev.problems)
        return replace(state, clean=clean, retiring=state.retiring if ev.clean else why)
    if isinstance(ev, Bye):
        return replace(state, byes=state.byes | {rank}, retiring=ev.why if ev.retire else state.retiring)
    raise TypeError(f"not a rank event: {ev!r}")


def record(state: LaunchState, events: Sequence[WatchEvent]) -> LaunchState:
    """``state`` with the ranks' events and the submitted cells folded in (an Exited changes nothing here)."""
    for event in events:
        if isinstance(event, Said):
            state = _said(state, event.rank, event.event)
        elif isinstance(event, Submitted):
            timeouts = state.timeouts if event.timeout_s is None else _put(state.timeouts, event.key, event.timeout_s)
            state = replace(state, submitted=(*state.submitted, event.key), timeouts=timeouts)
    return state


# ---- deciding -----------------------------------------------------------------------------------------------------
def decide(
    state: LaunchState, events: Sequence[WatchEvent], now: float, limits: Limits
) -> Tuple[LaunchState, List[Decision]]:
    """Fold ``events`` into ``state``; what to do now: cells decided, the launch retired, the rendezvous done."""
    before = len(state.ready)
    state = record(state, events)
    out: List[Decision] = []
    if before < limits.ranks <= len(state.ready):
        out.append(Rendezvoused(round(now - state.born, 3)))
    exited = next((e for e in events if isinstance(e, Exited)), None)
    for key in [k for k in state.ended if k not in state.finished and _reported(state, k, limits)]:
        out.append(_finish(state, key, _status(state.ended[key]), now))
        state = replace(state, finished=state.finished | {key})
    # cells run in order, so the oldest unfinished one is the culprit; later ones are just re-queued
    current = next((k for k in state.submitted if k in state.started and k not in state.finished), None)
    if current is not None:
        verdict = _died(state, current, exited, now, limits) if exited else _overdue(state, current, now, limits)
        if verdict is not None:
            out.append(verdict)
            state = replace(state, finished=state.finished | {current})
            if not exited:  # stuck: its stacks are dumped, then the launch is killed
                out.append(Retire(verdict.run.note))
                return state, out
    retire = _retirement(state, exited, now, limits)
    return state, out + ([retire] if retire is not None else [])


def _reported(state: LaunchState, key: str, limits: Limits) -> bool:
    return len(state.ended[key]) == limits.ranks and len(state.clean.get(key, {})) == limits.ranks


def _status(ends: Mapping[int, RankResult]) -> str:
    return "error" if any(r.status == "error" for r in ends.values()) else "ok"


def _overdue(state: LaunchState, key: str, now: float, limits: Limits) -> Optional[Finished]:
    """The running cell, if it is past its time: a rank stuck after another raised, a hang, or a hang in the cleanup
    after the cell."""
    first = min(state.started[key].values())
    ends = state.ended.get(key, {})
    errored = [r for r in ends.values() if r.status == "error"]
    limit = state.timeouts.get(key, limits.cell_timeout)
    # the ranks' barrier after a cell waits min(30, cell_timeout) (launcher.py), whatever the cell's own limit
    cleanup = max(limit, min(30.0, limits.cell_timeout))
    if len(ends) == limits.ranks:
        # past the ranks' own barrier timeout: the healthy ones have reported by then
        if now - state.end_t[key] > cleanup + limits.grace_s:
            return _stuck_in_cleanup(state, key, cleanup + limits.grace_s, now)
        return None
    if errored and now - state.end_t[key] > limits.grace_s:
        note = f"rank {errored[0].rank} raised; the others did not finish"
        return _stuck(state, key, "error", state.end_t[key], note, now)
    if now - first > limit:
        return _stuck(state, key, "hang", first + limit, f"no result within {limit:g}s", now)
    return None


def _retirement(state: LaunchState, exited: Optional[Exited], now: float, limits: Limits) -> Optional[Retire]:
    """Whether the launch ends now: torchrun exited, a rank asked for it and the launch is idle, or the ranks never
    rendezvoused."""
    if exited is not None:
        code = exited.returncode
        if code == 0 and not state.retiring and all(k in state.finished for k in state.submitted):
            return Retire("")  # every rank said goodbye: nothing failed, nothing to re-run
        return Retire(state.retiring or f"torchrun exited with {code}")
    if state.retiring and all(k in state.finished for k in state.started):
        return Retire(state.retiring)
    if len(state.ready) < limits.ranks and now - state.born > limits.startup_timeout:
        return Retire(f"ranks did not rendezvous within {limits.startup_timeout:.0f}s")
    return None


def _finish(
    state: LaunchState,
    key: str,
    status: str,
    now: float,
    extra: Sequence[RankResult] = (),
    detect_s: Optional[float] = None,
    note: str = "",
    dump: Sequence[int] = (),
) -> Finished:
    """The cell's CellRun. ``extra`` results override what a rank reported: a rank that died or hung in the cleanup
    after its End is told by what happened after, not by its End."""
    ranks = dict(state.ended.get(key, {}))
    ranks.update({r.rank: r for r in extra})
    start = min(state.started.get(key, {0: now}).values())
    end = state.end_t.get(key, now) if status in ("ok", "error") and not extra else now
    problems = merged_problems(state.clean.get(key, {}).values())
    run = CellRun(
        key=key,
        status=status,
        ranks=[ranks[r] for r in sorted(ranks)],
        duration_s=round(end - start, 3),
        launch=state.number,
        detect_s=detect_s,
        # a rank that is not clean retires the launch: the next cell runs in fresh ranks, never in this process
        note=note or ("; ".join(problems) + "; ranks restarted before the next cell" if problems else ""),
        hygiene=problems,
        env_removed=list(state.env_removed),
    )
    return Finished(key, run, tuple(sorted(dump)))


_LISTED = "global state changed by the cell: "
"""The head of the hygiene problem whose tail is a ``, ``-joined list of changes (runner/hygiene.py)."""


def merged_problems(per_rank: Iterable[Sequence[str]]) -> List[str]:
    """Every rank's hygiene problems once, sorted: the lists of global-state changes merged into one line, each change
    named once (a world shrunk to one rank changes $WORLD_SIZE on every rank and $RANK on rank 1 only: two distinct
    lines named $WORLD_SIZE twice)."""
    plain, changes = set(), set()
    for problems in per_rank:
        for problem in problems:
            if problem.startswith(_LISTED):
                changes.update(problem[len(_LISTED) :].split(", "))
            elif problem != "another rank is not clean":
                plain.add(problem)
    return sorted(plain | ({_LISTED + ", ".join(sorted(changes))} if changes else set()))


def _stuck(state: LaunchState, key: str, status: str, since: float, note: str, now: float) -> Finished:
    """Some ranks did not finish the cell: their stacks (for a hang, every rank's: where the finished ones wait is
    what the stuck one owes them), then the launch is killed."""
    ended = state.ended.get(key, {})
    missing = [r for r in state.pids if r not in ended]
    what = "did not finish after another rank raised" if status == "error" else "did not finish the cell"
    extra = [
        RankResult(rank=r, status="hang", error_message=f"rank {r} {what} ({note})", stack=NO_STACK) for r in missing
    ]
    dump = list(state.pids) if status == "hang" else missing
    if status == "hang":
        extra += [replace(ended[r], stack=NO_STACK) for r in ended if r in state.pids]
    return _finish(state, key, status, now, extra, round(now - since, 3), note, dump)


def _stuck_in_cleanup(state: LaunchState, key: str, waited: float, now: float) -> Finished:
    """Every rank ended the cell, but some never reported Clean: hung in the cleanup after the cell. The cell is a
    hang (it must not pass: the launch is gone), told by the stuck ranks with their stacks."""
    stuck = [r for r in state.pids if r not in state.clean.get(key, {})]
    ended = state.ended[key]
    note = (
        f"hung in cleanup after the cell: rank(s) {', '.join(map(str, sorted(stuck)))} reported their result "
        f"but not their cleanup within {waited:.0f}s"
    )
    extra = [
        replace(
            ended[r],
            status="hang",
            error_message=f"rank {r} hung in the cleanup after the cell (its own result was {ended[r].status})",
            stack=NO_STACK,
        )
        for r in stuck
    ]
    return _finish(state, key, "hang", now, extra, round(now - (state.end_t[key] + waited), 3), note, stuck)


def _died(state: LaunchState, key: str, exited: Exited, now: float, limits: Limits) -> Finished:
    """torchrun exited while ``key`` was unfinished. The rank that died speaks for the cell, with its exit code or
    signal: torchrun's root cause, or any rank that died of something other than torchrun's own SIGTERM. The ranks
    torchrun stopped after it are "stopped". A rank that had already reported End died in the cleanup after the
    cell, and its End does not make the cell pass."""
    died = {r for r, code in exited.codes.items() if r in exited.root or code != -signal.SIGTERM}
    culprits = ", ".join(f"rank {r}" for r in sorted(died)) or "a rank"
    ended = state.ended.get(key, {})
    extra = [
        _rank_after_exit(rank, exited, ended.get(rank), rank in died, culprits)
        for rank in range(limits.ranks)
        if rank not in ended or rank in died  # one that finished and was only stopped afterwards: its End stands
    ]
    # a rank that died takes precedence: the others' errors ("connection closed by peer") are its echo
    status = "crash" if any(r.status == "crash" for r in extra) else "error"
    detect_s = round(now - max(state.started[key].values()), 3)
    return _finish(state, key, status, now, extra, detect_s, f"torchrun exited with {exited.returncode}")


def _rank_after_exit(rank: int, exited: Exited, ended: Optional[RankResult], died: bool, culprits: str) -> RankResult:
    """One rank's result once torchrun exited: stopped while another node ran on, died in the cleanup after its End,
    died in the cell, stopped by torchrun, or gone without a word."""
    code = exited.codes.get(rank)
    stderr, error_file = exited.logs.get(rank, ("", None))
    how = dict(exit_code=code, signal=procs.signal_name(code), traceback=error_file, stack=stderr)
    if rank in exited.running and ended is None:
        message = f"rank {rank} was still running on node {exited.running[rank]} when another node's torchrun exited"
        return RankResult(rank=rank, status="stopped", error_message=message + f" ({culprits} died)")
    if ended is not None:
        message = f"rank {rank} died in the cleanup after the cell, {_death(code)} (its own result was {ended.status})"
        return replace(ended, status="crash", error_message=message, **how)
    if died:
        return RankResult(rank=rank, status="crash", error_message=f"rank {rank} died {_death(code)}", **how)
    if exited.codes:
        message = f"rank {rank} was stopped by torchrun after {culprits} died" + (
            f" ({_death(code)})" if code is not None else ""
        )
        return RankResult(rank=rank, status="stopped", error_message=message, **how)
    message = f"rank {rank} is gone, exit code unknown (torchrun exited with {exited.returncode})"
    return RankResult(rank=rank, status="crash", error_message=message, **how)


def _death(code: Optional[int]) -> str:
    name = procs.signal_name(code)
    return f"with exit code {code}" + (f" ({name})" if name else "")
