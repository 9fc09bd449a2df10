"""The batched launcher: one torchrun launch runs many cells, and outlives hangs, crashes and one-rank errors.

The caller ``submit``s cells and ``wait``s for each one's ``CellRun``. Ranks stay up between cells (paying the
~4 s of imports and rendezvous once); when a cell hangs, crashes or leaves a rank unclean, that launch is killed
(whole process tree, no orphans) and the cells not yet started continue in a fresh launch.
Polling happens in the caller's thread while it waits: no background thread to leak or race. Each poll reads the
ranks' events (launchdir.py), asks ``watching.decide`` what they mean, and carries out its decisions: a cell's
CellRun, stacks to dump, a launch to retire. A per-launch watchdog process (watchdog.py) kills the launch if this
process dies without doing it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from fsdp_matrix.clip import clip
from fsdp_matrix.errors import LaunchError, ResultsError
from fsdp_matrix.options import rendezvous_nodes
from fsdp_matrix.runner import launchdir
from fsdp_matrix.runner.launch import KILL_WAIT_S, Launch, LaunchSpec
from fsdp_matrix.runner.protocol import Order, Stop, Task
from fsdp_matrix.runner.watching import (
    NO_STACK,
    CellRun,
    Decision,
    Finished,
    Limits,
    Rendezvoused,
    Retire,
    Submitted,
    WatchEvent,
    decide,
    record,
)

__all__ = ["KILL_WAIT_S", "Launch", "LaunchSpec", "Launcher"]


@dataclass(kw_only=True)
class Launcher(LaunchSpec):
    """Runs cells on ``world_size`` ranks in as few torchrun launches as robustness allows: the queue, and the
    loop that carries out ``decide``'s decisions. How each launch starts (interpreter, ranks, nodes, rendezvous) is
    ``LaunchSpec``'s part; its processes are a ``Launch``'s (launch.py)."""

    run_root: Path
    """Where each launch gets its own directory (tasks, rank events, torchrun logs)."""
    grace_s: float = 5.0
    """After one rank reports an error, how long the others get to finish before they are declared stuck."""
    startup_timeout: float = 300.0
    """Seconds for every rank to import, rendezvous and report ready."""
    keep_dirs: bool = False
    """Keep every launch directory, clean or failed, and prune none."""
    keep_failed: int = 5
    """Directories of failed launches (hang, crash, killed, never started) kept for inspection under ``run_root``:
    the newest this many, counting those of earlier runs whose coordinator is gone; older ones are removed when a
    launch fails. A clean launch's directory is removed when it ends."""

    def __post_init__(self) -> None:
        self.run_root = Path(self.run_root)
        if self.nodes > 1 and self.torchrun_args != ["--standalone"]:
            raise LaunchError(
                f"a {self.nodes}-node launch on this machine makes its own rendezvous; torchrun args "
                f"{' '.join(self.torchrun_args)!r} cannot be added to it"
            )
        self._live: Optional[Launch] = None
        self._queue: List[Task] = []
        self._tasks: Dict[str, Task] = {}
        self._done: Dict[str, CellRun] = {}
        self._launches = 0
        self._failed_starts = 0
        self.launch_seconds: List[float] = []
        """Per launch: seconds from starting torchrun to every rank ready (imports + rendezvous)."""

    # ---- public API -------------------------------------------------------------------------------------------
    def submit(self, task: Task) -> None:
        """Queue a cell. It goes to the live launch at once (ranks move from one cell to the next without waiting
        for the caller), unless that launch is being retired; then it runs in the next one. Submitting the same key
        twice runs it once."""
        if task.key in self._tasks:
            return
        self._tasks[task.key] = task
        self._queue.append(task)
        if self._live is not None and self._live.state.retiring is None:
            self._feed(self._live)

    def wait(self, key: str) -> CellRun:
        """Block until ``key`` has a result. Every path out of a cell (ok, error, hang, crash) ends here."""
        if key not in self._tasks:
            raise KeyError(f"{key} was never submitted")
        while key not in self._done:
            if self._live is None:
                self._start()
            self._still_there(self._live)
            self._poll(self._live)
            if key not in self._done:
                time.sleep(0.01)
        return self._done[key]

    def close(self) -> None:
        live, self._live = self._live, None
        if live is None:
            return
        live.gone = True
        if not live.run_dir.is_dir():
            self._kill(live)  # removed under it (the run is stopping for that already): no rank can be asked to stop
            return
        self._write_task(live, Stop())
        # once every rank has said goodbye there is nothing left to lose: killing beats torchrun's slow shutdown
        deadline = time.monotonic() + 30
        while len(live.state.byes) < self.ranks and not live.exited() and time.monotonic() < deadline:
            live.state = record(live.state, self._read_events(live))
            time.sleep(0.01)
        clean = len(live.state.byes) == self.ranks or live.returncode() == 0
        try:
            self._kill(live)
        finally:
            self._retire(live, None if clean else f"ranks did not stop when asked (torchrun: {live.returncode()})")

    @property
    def layout(self) -> Tuple[int, int]:
        """(global world size, nodes) of the cells this launcher runs: its own nodes, or the rendezvous' node count
        when it starts one node of several machines."""
        nodes = self.nodes if self.nodes > 1 else rendezvous_nodes(self.torchrun_args)
        return self.world_size * nodes, nodes

    def idle(self) -> bool:
        """Every cell submitted so far has its result."""
        return all(key in self._done for key in self._tasks)

    def __enter__(self) -> Launcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- launch lifecycle -------------------------------------------------------------------------------------
    def _start(self) -> None:
        if self._launches and not self.run_root.is_dir():
            raise ResultsError(f"{self.run_root} was removed during the run: stopping")
        number = self._launches
        self._launches += 1
        if not self.keep_dirs:
            launchdir.prune(self.run_root, self.keep_failed)  # earlier runs' launches, killed before they could
        preload = sorted({task.repro for task in self._queue})
        self._live = Launch.start(self, self.run_root, number, preload)
        self._feed(self._live)

    def _feed(self, live: Launch) -> None:
        while self._queue:
            task = self._queue.pop(0)
            live.state = record(live.state, [Submitted(task.key, task.timeout_s)])
            self._write_task(live, task)

    # ---- watching: events in, decisions carried out -----------------------------------------------------------
    def _poll(self, live: Launch) -> None:
        # exit first, events second: an exited launch's last words are all on disk by now
        exited = launchdir.read_exit(live.agents, self.world_size, live.returncode()) if live.exited() else None
        events: List[WatchEvent] = [*self._read_events(live), *([exited] if exited else [])]
        limits = Limits(self.ranks, self.cell_timeout, self.grace_s, self.startup_timeout)
        live.state, decisions = decide(live.state, events, time.time(), limits)
        for decision in decisions:
            self._carry_out(live, decision)

    def _read_events(self, live: Launch) -> List[WatchEvent]:
        return live.read_events()

    def _carry_out(self, live: Launch, decision: Decision) -> None:
        """Act on one decision: note the rendezvous time, record a cell (its stuck ranks' stacks dumped first, while
        they are alive), or retire the launch."""
        if isinstance(decision, Rendezvoused):
            self.launch_seconds.append(decision.seconds)
        elif isinstance(decision, Finished):
            run = decision.run
            if decision.dump:
                stacks = live.dump_stacks({r: live.state.pids[r] for r in decision.dump if r in live.state.pids})
                ranks = [
                    replace(r, stack=stacks.get(r.rank) or NO_STACK) if r.rank in decision.dump else r
                    for r in run.ranks
                ]
                run = replace(run, ranks=ranks)
            self._done[decision.key] = run
        elif isinstance(decision, Retire):
            self._replace(live, decision.note)

    def _write_task(self, live: Launch, order: Order) -> None:
        try:
            live.write(order)
        except OSError:
            self._still_there(live)
            raise

    def _still_there(self, live: Launch) -> None:
        """The launch directory was removed under the launch (its results directory deleted): end the launch and
        stop the run with ResultsError. Its ranks can report nothing more, and the cell they run is not hung."""
        if live.run_dir.is_dir():
            return
        running = [k for k in live.state.submitted if k in live.state.started and k not in self._done][:1]
        self._live = None if self._live is live else self._live
        live.gone = True
        self._kill(live)
        what = f"while {running[0]} was running" if running else "while it ran"
        raise ResultsError(
            f"launch directory {live.run_dir} was removed {what} (its results directory deleted?): stopping the run"
            + ("; no verdict is recorded for that cell" if running else "")
        )

    def _replace(self, live: Launch, note: str) -> None:
        """Retire this launch (``note`` says why; empty when it ended cleanly by itself); re-queue, in order, every
        submitted cell it did not finish or start."""
        self._live = None
        live.gone = True
        # the culprit is already done; anything else it had been given runs again in the next launch
        self._queue[:0] = [self._tasks[k] for k in live.state.submitted if k not in self._done]
        try:
            self._kill(live)
        finally:
            if note:
                self._failed_starts = 0 if live.state.started else self._failed_starts + 1
                if self._failed_starts >= 2:
                    self._fail_queue(live, note)
            # every rank said goodbye (a planned retirement, e.g. over the leak budget): nothing to inspect
            self._retire(live, None if not note or len(live.state.byes) == self.ranks else note)

    def _retire(self, live: Launch, failed: Optional[str]) -> None:
        launchdir.retire(live.run_dir, failed, self.keep_dirs, self.keep_failed)

    def _fail_queue(self, live: Launch, note: str) -> None:
        """Two launches in a row died before running anything: the env is broken; say why instead of looping."""
        log = live.torchrun_log()
        # each try waited its own startup timeout: the note would read as one wait, for a run twice that long
        tries = f", in each of {self._failed_starts} launches in a row (no cell ran)"
        message = f"{note}{tries}\n{clip(log, lines=40, tail=True)}"
        for task in self._queue:
            # the note carries the reason; session.observe turns it into the one env-error outcome
            self._done[task.key] = CellRun(
                key=task.key,
                status="env-error",
                ranks=[],
                duration_s=0.0,
                launch=live.number,
                note=message,
                env_removed=list(live.state.env_removed),
            )
        self._queue.clear()

    def _kill(self, live: Launch) -> None:
        live.kill()
