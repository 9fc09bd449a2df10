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

import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import psutil

from fsdp_matrix.clip import clip
from fsdp_matrix.errors import LaunchError, ResultsError
from fsdp_matrix.options import CELL_TIMEOUT_S, rendezvous_nodes
from fsdp_matrix.runner import launchdir, procs
from fsdp_matrix.runner.protocol import (
    ENV_DEVICE,
    LOGS,
    TORCHRUN_OUT,
    WATCHDOG_OUT,
    Order,
    Stop,
    Task,
    launch_environ,
)
from fsdp_matrix.runner.watching import (
    NO_STACK,
    CellRun,
    Decision,
    Finished,
    LaunchState,
    Limits,
    Rendezvoused,
    Retire,
    Submitted,
    WatchEvent,
    decide,
    record,
)

KILL_WAIT_S = 10.0
"""How long torchrun may take to go after SIGKILL before that is an error (it cannot refuse SIGKILL)."""


@dataclass
class Launch:
    """The processes and files of the launch that runs now; what its events said is ``state``."""

    run_dir: Path
    """Node 0's launch directory."""
    proc: subprocess.Popen
    """Node 0's torchrun agent."""
    launch_id: str
    """procs.MARKER on each of its processes."""
    state: LaunchState
    """What its events said so far (watching.py), replaced at each poll."""
    seq: int = 0
    """Number of the next order written."""
    offsets: Dict[int, int] = field(default_factory=dict)
    """rank -> how far its events file has been read."""
    watchdog: Optional[subprocess.Popen] = None
    """The launch's watchdog process (watchdog.py)."""
    gone: bool = False
    """Replaced or closed: nothing more is decided about it."""
    more_agents: List[Tuple[Path, subprocess.Popen]] = field(default_factory=list)
    """A multi-node launch on this machine: the run directory and torchrun agent of nodes 1, 2, ... (node 0's are
    ``run_dir`` and ``proc``). Each node has its own directory, as each machine of a real multi-node run would."""

    @property
    def number(self) -> int:
        return self.state.number

    @property
    def agents(self) -> List[Tuple[Path, subprocess.Popen]]:
        """(run directory, torchrun) of every node this launcher started, node 0 first."""
        return [(self.run_dir, self.proc), *self.more_agents]

    def exited(self) -> bool:
        """Some node's torchrun has exited (for a one-node launch: torchrun has)."""
        return any(proc.poll() is not None for _, proc in self.agents)

    def returncode(self) -> Optional[int]:
        """The first non-zero exit code of the agents that exited, else 0 when all did, else None."""
        codes = [proc.poll() for _, proc in self.agents]
        bad = [c for c in codes if c not in (None, 0)]
        return bad[0] if bad else (0 if all(c == 0 for c in codes) else None)


@dataclass(kw_only=True)
class Launcher:
    """Runs cells on ``world_size`` ranks in as few torchrun launches as robustness allows."""

    run_root: Path
    """Where each launch gets its own directory (tasks, rank events, torchrun logs)."""
    device: str = "cpu"
    """``cpu`` (gloo) or ``cuda`` (nccl, one GPU per rank)."""
    world_size: int = 2
    """Ranks per node (torchrun's --nproc-per-node)."""
    nodes: int = 1
    """Nodes this launcher starts on this machine, one torchrun agent each (``--nnodes N --node-rank k``, c10d
    rendezvous on 127.0.0.1): a multi-node launch on one machine, every node with its own launch directory and
    scratch. Above 1, ``torchrun_args`` must be the default (the rendezvous is this launcher's own)."""
    cell_timeout: float = CELL_TIMEOUT_S
    """Seconds a cell may run on any rank before it is declared hung."""
    grace_s: float = 5.0
    """After one rank reports an error, how long the others get to finish before they are declared stuck."""
    startup_timeout: float = 300.0
    """Seconds for every rank to import, rendezvous and report ready."""
    torchrun_args: List[str] = field(default_factory=lambda: ["--standalone"])
    """Rendezvous options; the default lets torchrun pick a free port, so concurrent runs never collide."""
    shared_dir: Optional[Path] = None
    """Under a rendezvous of several machines: a folder every node sees (the same path on each), handed to the ranks
    as ``ctx.shared``; None there leaves them none. A launch on this machine makes its own."""
    python: str = sys.executable
    """Interpreter of the env under test."""
    env: Dict[str, str] = field(default_factory=dict)
    """Extra environment for the ranks."""
    seed: int = 0
    """Seed every rank sets before each cell."""
    leak_budget_mb: int = 512
    """Memory that modules left alive by cells may hold (FSDP1 leaks its flat parameters) before a fresh launch."""
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

    @property
    def ranks(self) -> int:
        """Ranks this launcher starts and watches: world_size on each of its nodes."""
        return self.world_size * self.nodes

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
        launch_id = uuid.uuid4().hex[:12]
        if not self.keep_dirs:
            launchdir.prune(self.run_root, self.keep_failed)  # earlier runs' launches, killed before they could
        settings = dict(
            seed=self.seed,
            cell_timeout=self.cell_timeout,
            barrier_timeout=min(30.0, self.cell_timeout),
            leak_budget_mb=self.leak_budget_mb,
            preload=sorted({task.repro for task in self._queue}),
        )
        external = self.external_rendezvous
        shared = (str(self.shared_dir) if self.shared_dir else "") if external else None
        run_dir = launchdir.create(self.run_root, number, launch_id, shared=shared, **settings)
        # node k > 0 of a launch on this machine: a directory of its own (tasks, events, scratch), as on its own host
        node_dirs = [run_dir] + [launchdir.create_node(run_dir, k, **settings) for k in range(1, self.nodes)]
        env, removed = self._environ(launch_id)
        # the watchdog first: from the moment torchrun exists, something outside this process can take it down
        watchdog = self._start_watchdog(run_dir, launch_id)
        (_, proc), *more = self._start_agents(node_dirs, launch_id, env, watchdog)
        state = LaunchState(number=number, born=time.time(), env_removed=tuple(removed))
        self._live = Launch(run_dir, proc, launch_id, state, watchdog=watchdog, more_agents=more)
        self._feed(self._live)

    def _environ(self, launch_id: str) -> Tuple[Dict[str, str], List[str]]:
        """The ranks' environment, and the caller's variables left out of it (protocol.launch_environ)."""
        inherited, removed = launch_environ(dict(os.environ))
        env = {
            **inherited,
            **self.env,
            procs.MARKER: launch_id,
            ENV_DEVICE: self.device,
            "PYTHONUNBUFFERED": "1",
        }
        if self.device == "cpu":
            # ranks fighting over every core makes each cell slower, not faster
            env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 2) // self.ranks)))
        if self.nodes > 1:
            loopback = procs.loopback_interface()
            if loopback and not any(k in env for k in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")):
                # the nodes of a launch on one machine talk over loopback only, never a real interface
                env.update(GLOO_SOCKET_IFNAME=loopback, NCCL_SOCKET_IFNAME=loopback)
        return env, removed

    def _start_agents(
        self, node_dirs: List[Path], launch_id: str, env: Dict[str, str], watchdog: subprocess.Popen
    ) -> List[Tuple[Path, subprocess.Popen]]:
        """One torchrun agent per node; LaunchError (and nothing left running) if one cannot start."""
        agents = []
        try:
            for node, node_dir in enumerate(node_dirs):
                cmd = [
                    self.python,
                    "-m",
                    "torch.distributed.run",
                    *self._rendezvous(node, launch_id),
                    f"--nproc-per-node={self.world_size}",
                    f"--log-dir={node_dir / LOGS}",
                    "--redirects=3",
                    "--max-restarts=0",
                    "-m",
                    "fsdp_matrix.runner.worker",
                    str(node_dir),
                ]
                with open(node_dir / TORCHRUN_OUT, "w") as out:
                    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
                agents.append((node_dir, proc))
        except OSError as exc:
            for _, proc in agents:
                proc.kill()
                proc.wait()
            watchdog.kill()
            watchdog.wait()
            raise LaunchError(f"cannot start torchrun with {self.python}: {exc}") from None
        return agents

    @property
    def external_rendezvous(self) -> bool:
        """torchrun_args name a rendezvous of several machines (--nnodes above 1): this launcher starts one node of
        it, and no folder is shared by every rank."""
        return rendezvous_nodes(self.torchrun_args) > 1

    def _rendezvous(self, node: int, launch_id: str) -> List[str]:
        """torchrun's rendezvous options for ``node``: the caller's for a one-node launch; for a launch of several
        nodes on this machine, c10d on 127.0.0.1 with node 0 hosting the store (``is_host``), so neither agent has
        to guess from host names which one serves it."""
        if self.nodes == 1:
            return list(self.torchrun_args)
        if node == 0:
            self._port = procs.free_port()
        return [
            f"--nnodes={self.nodes}",
            f"--node-rank={node}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{self._port}",
            f"--rdzv-id={launch_id}",
            f"--rdzv-conf=is_host={int(node == 0)}",
            "--local-addr=127.0.0.1",
        ]

    @staticmethod
    def _start_watchdog(run_dir: Path, launch_id: str) -> subprocess.Popen:
        """The launch's watchdog (watchdog.py), in a session of its own so that no signal meant for this process's
        group reaches it; it kills the launch if this process dies without doing so."""
        me = psutil.Process()
        with open(run_dir / WATCHDOG_OUT, "w") as out:
            return subprocess.Popen(
                [sys.executable, "-m", "fsdp_matrix.runner.watchdog", str(me.pid), repr(me.create_time()), launch_id],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, procs.MARKER: launch_id},
                start_new_session=True,
            )

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
        """Every rank's new events, in rank order (a rank's slot is node x world_size + local rank)."""
        events: List[WatchEvent] = []
        for slot in range(self.ranks):
            node, local = divmod(slot, self.world_size)
            said, live.offsets[slot] = launchdir.read_events(
                live.agents[node][0], local, slot, live.offsets.get(slot, 0)
            )
            events += said
        return events

    def _carry_out(self, live: Launch, decision: Decision) -> None:
        """Act on one decision: note the rendezvous time, record a cell (its stuck ranks' stacks dumped first, while
        they are alive), or retire the launch."""
        if isinstance(decision, Rendezvoused):
            self.launch_seconds.append(decision.seconds)
        elif isinstance(decision, Finished):
            run = decision.run
            if decision.dump:
                stacks = self._dump_stacks(live, {r: live.state.pids[r] for r in decision.dump if r in live.state.pids})
                ranks = [
                    replace(r, stack=stacks.get(r.rank) or NO_STACK) if r.rank in decision.dump else r
                    for r in run.ranks
                ]
                run = replace(run, ranks=ranks)
            self._done[decision.key] = run
        elif isinstance(decision, Retire):
            self._replace(live, decision.note)

    def _dump_stacks(self, live: Launch, ranks: Dict[int, Tuple[int, float]]) -> Dict[int, str]:
        """procs.dump_stacks, node by node: each node's ranks dump into its own directory, by local rank."""
        out: Dict[int, str] = {}
        for node, (run_dir, _) in enumerate(live.agents):
            first = node * self.world_size
            here = {slot - first: ident for slot, ident in ranks.items() if 0 <= slot - first < self.world_size}
            if here:
                dumped = procs.dump_stacks(here, run_dir)
                out.update({first + local: text for local, text in dumped.items()})
        return out

    def _write_task(self, live: Launch, order: Order) -> None:
        try:
            for run_dir, _ in live.agents:  # every node reads its own copy, as on its own host
                launchdir.write_order(run_dir, live.seq, order)
        except OSError:
            self._still_there(live)
            raise
        live.seq += 1

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
        log = "\n".join(
            (run_dir / TORCHRUN_OUT).read_text(errors="replace")
            for run_dir, _ in live.agents
            if (run_dir / TORCHRUN_OUT).exists()
        )
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
        """SIGKILL the launch: torchrun's tree, and every process with its marker (ranks in their own sessions, the
        watchdog). Raises LaunchError if torchrun is still there ``KILL_WAIT_S`` later: that is never normal (a
        process stuck in the kernel, e.g. on a hung device), and a launch that cannot be ended must not be hidden."""
        trees = [p for _, agent in live.agents for p in procs.tree(agent.pid)]
        victims = {p.pid: p for p in trees + procs.marked(live.launch_id)}
        procs.kill_all(victims.values())
        stuck = []
        agents = [(f"torchrun of node {k}" if k else "torchrun", agent) for k, (_, agent) in enumerate(live.agents)]
        for name, child in (*agents, ("watchdog", live.watchdog)):
            if child is None:
                continue
            if child.poll() is None and name == "watchdog":
                child.kill()  # ours to end even if the marker sweep did not see it
            try:
                child.wait(timeout=KILL_WAIT_S)  # reaps it: both are this process's children
            except subprocess.TimeoutExpired:
                stuck.append(f"{name} {child.pid}")
        if stuck:
            survivors = [p.pid for p in victims.values() if _alive(p)]
            raise LaunchError(
                f"launch {live.number} ({live.run_dir}): {', '.join(stuck)} still running {KILL_WAIT_S:.0f}s after "
                f"SIGKILL" + (f"; alive too: {survivors}" if survivors else "")
            )


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
