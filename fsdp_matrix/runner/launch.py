"""One torchrun launch and the processes it owns: start it, read its ranks' events, dump their stacks, kill it.

``Launch.start`` creates the launch directory (launchdir.py), starts the watchdog (watchdog.py) and one torchrun
agent per node. The ``Launcher`` (launcher.py) keeps the queue and the loop; it asks a ``Launch`` only to write an
order, read what the ranks said, dump stacks and end. Every process a launch starts carries ``procs.MARKER``, so
``kill`` finds ranks that left torchrun's tree too.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import psutil

from fsdp_matrix.errors import LaunchError
from fsdp_matrix.options import CELL_TIMEOUT_S, rendezvous_nodes
from fsdp_matrix.runner import launchdir, procs
from fsdp_matrix.runner.protocol import ENV_DEVICE, LOGS, TORCHRUN_OUT, WATCHDOG_OUT, Order, launch_environ
from fsdp_matrix.runner.watching import LaunchState, WatchEvent

KILL_WAIT_S = 10.0
"""How long torchrun may take to go after SIGKILL before that is an error (it cannot refuse SIGKILL)."""


@dataclass(kw_only=True)
class LaunchSpec:
    """How every launch of a launcher starts: interpreter, ranks, nodes, rendezvous and the ranks' settings."""

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

    @property
    def ranks(self) -> int:
        """Ranks this launcher starts and watches: world_size on each of its nodes."""
        return self.world_size * self.nodes

    @property
    def external_rendezvous(self) -> bool:
        """torchrun_args name a rendezvous of several machines (--nnodes above 1): this launcher starts one node of
        it, and no folder is shared by every rank."""
        return rendezvous_nodes(self.torchrun_args) > 1


@dataclass
class Launch:
    """The processes and files of one launch; what its events said is ``state``."""

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
    world_size: int = 2
    """Ranks per node: a rank's slot is node x world_size + local rank."""

    @classmethod
    def start(cls, spec: LaunchSpec, run_root: Path, number: int, preload: Sequence[str]) -> Launch:
        """Create launch ``number``'s directories under ``run_root`` and start its watchdog and agents; LaunchError
        (and nothing left running) if an agent cannot start."""
        launch_id = uuid.uuid4().hex[:12]
        settings = dict(
            seed=spec.seed,
            cell_timeout=spec.cell_timeout,
            barrier_timeout=min(30.0, spec.cell_timeout),
            leak_budget_mb=spec.leak_budget_mb,
            preload=list(preload),
        )
        external = spec.external_rendezvous
        shared = (str(spec.shared_dir) if spec.shared_dir else "") if external else None
        run_dir = launchdir.create(run_root, number, launch_id, shared=shared, **settings)
        # node k > 0 of a launch on this machine: a directory of its own (tasks, events, scratch), as on its own host
        node_dirs = [run_dir] + [launchdir.create_node(run_dir, k, **settings) for k in range(1, spec.nodes)]
        env, removed = _environ(spec, launch_id)
        # the watchdog first: from the moment torchrun exists, something outside this process can take it down
        watchdog = _start_watchdog(run_dir, launch_id)
        (_, proc), *more = _start_agents(spec, node_dirs, launch_id, env, watchdog)
        state = LaunchState(number=number, born=time.time(), env_removed=tuple(removed))
        return cls(run_dir, proc, launch_id, state, watchdog=watchdog, more_agents=more, world_size=spec.world_size)

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

    def write(self, order: Order) -> None:
        """Hand every node its own copy of the next order, as on its own host; OSError if a directory is gone."""
        for run_dir, _ in self.agents:
            launchdir.write_order(run_dir, self.seq, order)
        self.seq += 1

    def read_events(self) -> List[WatchEvent]:
        """Every rank's new events, in rank order (a rank's slot is node x world_size + local rank)."""
        events: List[WatchEvent] = []
        for slot in range(self.world_size * len(self.agents)):
            node, local = divmod(slot, self.world_size)
            said, self.offsets[slot] = launchdir.read_events(
                self.agents[node][0], local, slot, self.offsets.get(slot, 0)
            )
            events += said
        return events

    def dump_stacks(self, ranks: Dict[int, Tuple[int, float]]) -> Dict[int, str]:
        """procs.dump_stacks, node by node: each node's ranks dump into its own directory, by local rank."""
        out: Dict[int, str] = {}
        for node, (run_dir, _) in enumerate(self.agents):
            first = node * self.world_size
            here = {slot - first: ident for slot, ident in ranks.items() if 0 <= slot - first < self.world_size}
            if here:
                dumped = procs.dump_stacks(here, run_dir)
                out.update({first + local: text for local, text in dumped.items()})
        return out

    def torchrun_log(self) -> str:
        """What every node's torchrun printed, node 0 first."""
        return "\n".join(
            (run_dir / TORCHRUN_OUT).read_text(errors="replace")
            for run_dir, _ in self.agents
            if (run_dir / TORCHRUN_OUT).exists()
        )

    def kill(self) -> None:
        """SIGKILL the launch: torchrun's tree, and every process with its marker (ranks in their own sessions, the
        watchdog). Raises LaunchError if torchrun is still there ``KILL_WAIT_S`` later: that is never normal (a
        process stuck in the kernel, e.g. on a hung device), and a launch that cannot be ended must not be hidden."""
        trees = [p for _, agent in self.agents for p in procs.tree(agent.pid)]
        victims = {p.pid: p for p in trees + procs.marked(self.launch_id)}
        procs.kill_all(victims.values())
        stuck = []
        agents = [(f"torchrun of node {k}" if k else "torchrun", agent) for k, (_, agent) in enumerate(self.agents)]
        for name, child in (*agents, ("watchdog", self.watchdog)):
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
                f"launch {self.number} ({self.run_dir}): {', '.join(stuck)} still running {KILL_WAIT_S:.0f}s after "
                f"SIGKILL" + (f"; alive too: {survivors}" if survivors else "")
            )


def _environ(spec: LaunchSpec, launch_id: str) -> Tuple[Dict[str, str], List[str]]:
    """The ranks' environment, and the caller's variables left out of it (protocol.launch_environ)."""
    inherited, removed = launch_environ(dict(os.environ))
    env = {
        **inherited,
        **spec.env,
        procs.MARKER: launch_id,
        ENV_DEVICE: spec.device,
        "PYTHONUNBUFFERED": "1",
    }
    if spec.device == "cpu":
        # ranks fighting over every core makes each cell slower, not faster
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 2) // spec.ranks)))
    if spec.nodes > 1:
        loopback = procs.loopback_interface()
        if loopback and not any(k in env for k in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")):
            # the nodes of a launch on one machine talk over loopback only, never a real interface
            env.update(GLOO_SOCKET_IFNAME=loopback, NCCL_SOCKET_IFNAME=loopback)
    return env, removed


def _start_agents(
    spec: LaunchSpec, node_dirs: List[Path], launch_id: str, env: Dict[str, str], watchdog: subprocess.Popen
) -> List[Tuple[Path, subprocess.Popen]]:
    """One torchrun agent per node; LaunchError (and nothing left running) if one cannot start."""
    agents = []
    port = procs.free_port() if spec.nodes > 1 else 0
    try:
        for node, node_dir in enumerate(node_dirs):
            cmd = [
                spec.python,
                "-m",
                "torch.distributed.run",
                *_rendezvous(spec, node, launch_id, port),
                f"--nproc-per-node={spec.world_size}",
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
        raise LaunchError(f"cannot start torchrun with {spec.python}: {exc}") from None
    return agents


def _rendezvous(spec: LaunchSpec, node: int, launch_id: str, port: int) -> List[str]:
    """torchrun's rendezvous options for ``node``: the caller's for a one-node launch; for a launch of several
    nodes on this machine, c10d on 127.0.0.1:``port`` with node 0 hosting the store (``is_host``), so neither agent
    has to guess from host names which one serves it."""
    if spec.nodes == 1:
        return list(spec.torchrun_args)
    return [
        f"--nnodes={spec.nodes}",
        f"--node-rank={node}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        f"--rdzv-id={launch_id}",
        f"--rdzv-conf=is_host={int(node == 0)}",
        "--local-addr=127.0.0.1",
    ]


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


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
