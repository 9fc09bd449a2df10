"""The batched launcher: one torchrun launch runs many cells, and outlives hangs, crashes and one-rank errors.

The caller ``submit``s cells and ``wait``s for each one's ``CellRun``. Ranks stay up between cells (paying the
~4 s of imports and rendezvous once); when a cell hangs, crashes or leaves a rank unclean, that launch is killed
(whole process tree, no orphans) and the cells not yet started continue in a fresh launch.
Polling happens in the caller's thread while it waits: no background thread to leak or race.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

from fsdp_matrix.clip import clip
from fsdp_matrix.errors import LaunchError
from fsdp_matrix.records import RankResult
from fsdp_matrix.runner import procs
from fsdp_matrix.runner.protocol import (
    TASKS,
    Bye,
    Clean,
    End,
    Hello,
    Order,
    Ready,
    Start,
    Stop,
    Task,
    decode_event,
    encode_order,
)


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


@dataclass
class _Live:
    """Bookkeeping for the launch currently running."""

    number: int
    run_dir: Path
    proc: subprocess.Popen
    launch_id: str
    seq: int = 0
    pids: Dict[int, int] = field(default_factory=dict)
    ready: set = field(default_factory=set)
    byes: set = field(default_factory=set)
    offsets: Dict[int, int] = field(default_factory=dict)
    started: Dict[str, Dict[int, float]] = field(default_factory=dict)
    ended: Dict[str, Dict[int, RankResult]] = field(default_factory=dict)
    end_t: Dict[str, float] = field(default_factory=dict)
    clean: Dict[str, Dict[int, List[str]]] = field(default_factory=dict)
    retiring: Optional[str] = None
    born: float = field(default_factory=time.monotonic)
    submitted: List[str] = field(default_factory=list)


@dataclass(kw_only=True)
class Launcher:
    """Runs cells on ``world_size`` ranks in as few torchrun launches as robustness allows."""

    run_root: Path
    """Where each launch gets its own directory (tasks, rank events, torchrun logs)."""
    device: str = "cpu"
    """``cpu`` (gloo) or ``cuda`` (nccl, one GPU per rank)."""
    world_size: int = 2
    """Ranks per launch (per node when torchrun_args asks for several nodes)."""
    cell_timeout: float = 120.0
    """Seconds a cell may run on any rank before it is declared hung."""
    grace_s: float = 5.0
    """After one rank reports an error, how long the others get to finish before they are declared stuck."""
    startup_timeout: float = 300.0
    """Seconds for every rank to import, rendezvous and report ready."""
    torchrun_args: List[str] = field(default_factory=lambda: ["--standalone"])
    """Rendezvous options; the default lets torchrun pick a free port, so concurrent runs never collide."""
    python: str = sys.executable
    """Interpreter of the env under test."""
    env: Dict[str, str] = field(default_factory=dict)
    """Extra environment for the ranks."""
    seed: int = 0
    """Seed every rank sets before each cell."""
    leak_budget_mb: int = 512
    """Memory that modules left alive by cells may hold (FSDP1 leaks its flat parameters) before a fresh launch."""
    keep_dirs: bool = False
    """Keep launch directories of clean launches (those with a failure are always kept)."""

    def __post_init__(self) -> None:
        self.run_root = Path(self.run_root)
        self._live: Optional[_Live] = None
        self._queue: List[Task] = []
        self._tasks: Dict[str, Task] = {}
        self._done: Dict[str, CellRun] = {}
        self._launches = 0
        self._failed_starts = 0
        self.launch_seconds: List[float] = []
        """Per launch: seconds from starting torchrun to every rank ready (imports + rendezvous)."""
        self.launch_ids: List[str] = []
        """Marker of every launch started, in order (procs.MARKER on each of its processes)."""

    # ---- public API -------------------------------------------------------------------------------------------
    def submit(self, task: Task) -> None:
        """Queue a cell. It goes to the live launch at once (ranks move from one cell to the next without waiting
        for the caller), unless that launch is being retired; then it runs in the next one. Submitting the same key
        twice runs it once."""
        if task.key in self._tasks:
            return
        self._tasks[task.key] = task
        self._queue.append(task)
        if self._live is not None and self._live.retiring is None:
            self._feed(self._live)

    def wait(self, key: str) -> CellRun:
        """Block until ``key`` has a result. Every path out of a cell (ok, error, hang, crash) ends here."""
        if key not in self._tasks:
            raise KeyError(f"{key} was never submitted")
        while key not in self._done:
            if self._live is None:
                self._start()
            self._poll(self._live)
            if key not in self._done:
                time.sleep(0.01)
        return self._done[key]

    def close(self) -> None:
        live, self._live = self._live, None
        if live is None:
            return
        self._write_task(live, Stop())
        # once every rank has said goodbye there is nothing left to lose: killing beats torchrun's slow shutdown
        deadline = time.monotonic() + 30
        while len(live.byes) < self.world_size and live.proc.poll() is None and time.monotonic() < deadline:
            self._read_events(live)
            time.sleep(0.01)
        clean = len(live.byes) == self.world_size or live.proc.returncode == 0
        self._kill(live)
        if not self.keep_dirs and clean:
            shutil.rmtree(live.run_dir, ignore_errors=True)

    def __enter__(self) -> Launcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- launch lifecycle -------------------------------------------------------------------------------------
    def _start(self) -> None:
        number = self._launches
        self._launches += 1
        launch_id = uuid.uuid4().hex[:12]
        self.launch_ids.append(launch_id)
        run_dir = self.run_root / f"launch-{number}-{launch_id}"
        (run_dir / TASKS).mkdir(parents=True)
        (run_dir / "scratch").mkdir()
        (run_dir / "launch.json").write_text(
            json.dumps(
                {
                    "scratch": str(run_dir / "scratch"),
                    "seed": self.seed,
                    "cell_timeout": self.cell_timeout,
                    "barrier_timeout": min(30.0, self.cell_timeout),
                    "coordinator": os.getpid(),
                    "leak_budget_mb": self.leak_budget_mb,
                }
            )
        )
        env = {
            **os.environ,
            **self.env,
            procs.MARKER: launch_id,
            "FSDP_MATRIX_DEVICE": self.device,
            "PYTHONUNBUFFERED": "1",
        }
        env.pop("TORCHELASTIC_ERROR_FILE", None)  # torchrun sets one per rank under --log-dir
        if self.device == "cpu":
            # two ranks fighting over every core makes each cell slower, not faster
            env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 2) // self.world_size)))
        cmd = [
            self.python,
            "-m",
            "torch.distributed.run",
            *self.torchrun_args,
            f"--nproc-per-node={self.world_size}",
            f"--log-dir={run_dir / 'logs'}",
            "--redirects=3",
            "--max-restarts=0",
            "-m",
            "fsdp_matrix.runner.worker",
            str(run_dir),
        ]
        out = open(run_dir / "torchrun.out", "w")
        try:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        except OSError as exc:
            raise LaunchError(f"cannot start torchrun with {self.python}: {exc}") from None
        finally:
            out.close()
        self._live = _Live(number, run_dir, proc, launch_id)
        self._feed(self._live)

    def _feed(self, live: _Live) -> None:
        while self._queue:
            task = self._queue.pop(0)
            live.submitted.append(task.key)
            self._write_task(live, task)

    @staticmethod
    def _write_task(live: _Live, order: Order) -> None:
        tasks = live.run_dir / TASKS
        tmp = tasks / f".{live.seq:05d}.tmp"
        tmp.write_text(encode_order(order))
        os.replace(tmp, tasks / f"{live.seq:05d}.json")  # atomic: a rank never reads half a task
        live.seq += 1

    def _replace(self, live: _Live, note: str) -> None:
        """Retire this launch; re-queue, in order, every submitted cell it did not finish or start."""
        self._kill(live)
        self._live = None
        # the culprit is already done; anything else it had been given runs again in the next launch
        self._queue[:0] = [self._tasks[k] for k in live.submitted if k not in self._done]
        if not live.started:
            self._failed_starts += 1
        else:
            self._failed_starts = 0
        if self._failed_starts >= 2:
            self._fail_queue(live, note)

    def _fail_queue(self, live: _Live, note: str) -> None:
        """Two launches in a row died before running anything: the env is broken; say why instead of looping."""
        log = (
            (live.run_dir / "torchrun.out").read_text(errors="replace")
            if (live.run_dir / "torchrun.out").exists()
            else ""
        )
        message = f"{note}\n{clip(log, lines=40, tail=True)}"
        for task in self._queue:
            # the note carries the reason; session.observe turns it into the one env-error outcome
            self._done[task.key] = CellRun(
                key=task.key, status="env-error", ranks=[], duration_s=0.0, launch=live.number, note=message
            )
        self._queue.clear()

    def _kill(self, live: _Live) -> None:
        victims = {p.pid: p for p in procs.tree(live.proc.pid) + procs.marked(live.launch_id)}
        procs.kill_all(victims.values())
        try:
            live.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass

    # ---- watching ---------------------------------------------------------------------------------------------
    def _read_events(self, live: _Live) -> None:
        for rank in range(self.world_size):
            path = live.run_dir / f"rank{rank}.jsonl"
            if not path.exists():
                continue
            with open(path, encoding="utf-8") as fh:
                fh.seek(live.offsets.get(rank, 0))
                while True:
                    pos = fh.tell()
                    line = fh.readline()
                    if not line.endswith("\n"):
                        fh.seek(pos)  # half-written line: read it whole next time
                        break
                    self._apply(live, rank, line)
                live.offsets[rank] = fh.tell()

    def _apply(self, live: _Live, rank: int, line: str) -> None:
        event = decode_event(line)
        getattr(self, f"worker_{event.event}")(live, rank, event)

    # one handler per rank event, as pytest-xdist's scheduler dispatches worker_<event>
    def worker_hello(self, live: _Live, rank: int, ev: Hello) -> None:
        live.pids[rank] = ev.pid

    def worker_ready(self, live: _Live, rank: int, ev: Ready) -> None:
        live.ready.add(rank)
        if len(live.ready) == self.world_size:
            self.launch_seconds.append(round(time.monotonic() - live.born, 3))

    def worker_start(self, live: _Live, rank: int, ev: Start) -> None:
        live.started.setdefault(ev.key, {})[rank] = ev.t

    def worker_end(self, live: _Live, rank: int, ev: End) -> None:
        live.ended.setdefault(ev.key, {})[rank] = ev.result
        live.end_t[ev.key] = max(live.end_t.get(ev.key, 0.0), ev.t)

    def worker_clean(self, live: _Live, rank: int, ev: Clean) -> None:
        live.clean.setdefault(ev.key, {})[rank] = list(ev.problems)
        if not ev.clean:
            live.retiring = f"rank {rank} not clean after {ev.key}: " + "; ".join(ev.problems)

    def worker_bye(self, live: _Live, rank: int, ev: Bye) -> None:
        live.byes.add(rank)
        if ev.retire:
            live.retiring = ev.why

    def _poll(self, live: _Live) -> None:
        self._read_events(live)
        for key, ends in list(live.ended.items()):
            if (
                key not in self._done
                and len(ends) == self.world_size
                and len(live.clean.get(key, {})) == self.world_size
            ):
                self._finish(live, key, "error" if any(r.status == "error" for r in ends.values()) else "ok")
        exited = live.proc.poll() is not None
        if exited:
            self._read_events(live)  # last words
        # cells run in order, so the oldest unfinished one is the culprit; later ones are just re-queued
        current = [k for k in live.submitted if k in live.started and k not in self._done][:1]
        now = time.time()
        for key in current:
            first = min(live.started[key].values())
            errored = [r for r in live.ended.get(key, {}).values() if r.status == "error"]
            if exited:
                self._crash(live, key)
            elif errored and now - live.end_t[key] > self.grace_s:
                self._stuck(
                    live, key, "error", live.end_t[key], f"rank {errored[0].rank} raised; the others did not finish"
                )
            elif now - first > self.cell_timeout:
                self._stuck(live, key, "hang", first + self.cell_timeout, f"no result within {self.cell_timeout:.0f}s")
        if self._live is not live:
            return
        idle = all(k in self._done for k in live.started)
        if exited:
            if live.proc.returncode == 0 and not live.retiring and all(k in self._done for k in live.submitted):
                self._live = None
                return
            self._replace(live, live.retiring or f"torchrun exited with {live.proc.returncode}")
        elif live.retiring and idle:
            self._replace(live, live.retiring)
        elif len(live.ready) < self.world_size and time.monotonic() - live.born > self.startup_timeout:
            self._replace(live, f"ranks did not rendezvous within {self.startup_timeout:.0f}s")

    def _finish(
        self,
        live: _Live,
        key: str,
        status: str,
        extra: Optional[List[RankResult]] = None,
        detect_s: Optional[float] = None,
        note: str = "",
    ) -> None:
        ranks = dict(live.ended.get(key, {}))
        for r in extra or []:
            ranks.setdefault(r.rank, r)
        start = min(live.started.get(key, {0: time.time()}).values())
        end = live.end_t.get(key, time.time()) if status in ("ok", "error") and not extra else time.time()
        problems = sorted(
            {p for ps in live.clean.get(key, {}).values() for p in ps if p != "another rank is not clean"}
        )
        self._done[key] = CellRun(
            key=key,
            status=status,
            ranks=[ranks[r] for r in sorted(ranks)],
            duration_s=round(end - start, 3),
            launch=live.number,
            detect_s=detect_s,
            note=note or "; ".join(problems),
            hygiene=problems,
        )

    def _stuck(self, live: _Live, key: str, status: str, since: float, note: str) -> None:
        """Some ranks did not finish: dump their stacks, then kill the launch."""
        missing = {r: pid for r, pid in live.pids.items() if r not in live.ended.get(key, {})}
        stacks = procs.dump_stacks(missing, live.run_dir)
        extra = [RankResult(rank=r, status="hang", stack=stacks.get(r) or "(no stack dumped)") for r in missing]
        self._finish(live, key, status, extra, detect_s=round(time.time() - since, 3), note=note)
        self._replace(live, note)

    def _crash(self, live: _Live, key: str) -> None:
        codes = procs.torchrun_failures((live.run_dir / "torchrun.out").read_text(errors="replace"))
        extra = []
        for rank in range(self.world_size):
            if rank in live.ended.get(key, {}):
                continue
            stderr, error_file = procs.rank_logs(live.run_dir / "logs", rank)
            code = codes.get(rank)
            extra.append(
                RankResult(
                    rank=rank,
                    status="crash",
                    exit_code=code,
                    signal=procs.signal_name(code),
                    error_message=f"rank {rank} died with exit code {code}"
                    + (f" ({procs.signal_name(code)})" if procs.signal_name(code) else ""),
                    traceback=error_file,
                    stack=stderr,
                )
            )
        # a rank that died takes precedence: the others' errors ("connection closed by peer") are its echo
        status = "crash" if extra else "error"
        self._finish(
            live,
            key,
            status,
            extra,
            detect_s=round(time.time() - max(live.started[key].values()), 3),
            note=f"torchrun exited with {live.proc.returncode}",
        )
