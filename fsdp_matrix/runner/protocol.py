"""The messages between the launcher and the ranks of one launch, both directions, as typed dataclasses.

Launcher -> ranks: ``RUN_DIR/launch.json`` (the launch's settings, read once at start), then numbered task files
``RUN_DIR/tasks/00000.json, 00001.json, ...``, each written atomically and read by every rank in order, so all ranks
run the same cells in the same order without a collective to agree on it.
Ranks -> launcher: one JSON line per event, appended and flushed to ``RUN_DIR/rank<local rank>.jsonl``.

A rank that raised reports it (``End`` with an error result); a rank that died says nothing more, and the launcher
learns that from the process, not from a message. The two never mix.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Dict, List, Optional, Tuple, Union

from fsdp_matrix.records import RankResult

# ---- the launch directory's layout and the launch's environment variables: declared here and nowhere else -------

TASKS = "tasks"
"""Folder of the task files in a launch directory."""
LAUNCH_JSON = "launch.json"
"""The launch's settings, in its directory."""
SCRATCH = "scratch"
"""Folder the ranks of one node share (see LaunchConfig.scratch)."""
SHARED = "shared"
"""Folder every rank of a launch started on this machine shares, over all its nodes (see LaunchConfig.shared)."""
NODE_DIR = "node{}"
"""Directory of node k > 0 of a multi-node launch on this machine, inside the launch directory (node 0 uses the
launch directory itself)."""
LOGS = "logs"
"""torchrun's --log-dir: each rank's stdout/stderr and error file."""
TORCHRUN_OUT = "torchrun.out"
"""torchrun's own output (its failure summary names the ranks that died)."""
WATCHDOG_OUT = "watchdog.out"
"""The launch watchdog's output."""
RETIRED = "retired.txt"
"""Written into a failed launch's directory when it is retired: why. A retired directory may be pruned."""

ENV_LAUNCH = "FSDP_MATRIX_LAUNCH"
"""Set on every process of a launch (its launch id), so a sweep finds even children that escaped the tree."""
ENV_DEVICE = "FSDP_MATRIX_DEVICE"
"""``cpu`` or ``cuda``: what the ranks run on."""
ENV_SHARE_GPU = "FSDP_MATRIX_SHARE_GPU"
"""``1``: ranks share the GPUs when there are fewer than ranks (``run --share-gpu``; worker.make_context)."""


STRIPPED_ENV_PREFIXES = (
    "ACCELERATE_",
    "FSDP_",
    "PARALLELISM_CONFIG_",
    "TORCHELASTIC_",
    "TORCH_COMPILE_",
    "TORCHDYNAMO_",
    "TORCHINDUCTOR_",
    "TORCH_NCCL_",
    "TORCH_FORCE_",
)
"""The caller's variables a rank never inherits, because they change what a cell exercises:

- ``ACCELERATE_*`` / ``FSDP_*`` / ``PARALLELISM_CONFIG_*``: accelerate's and transformers' FSDP choices
  (``ACCELERATE_USE_FSDP=true`` in a shell made every accelerate cell a false REGRESSION);
- ``TORCHELASTIC_*``: torchrun's own business, per launch;
- ``TORCH_COMPILE_*`` / ``TORCHDYNAMO_*`` / ``TORCHINDUCTOR_*``: ``TORCH_COMPILE_DISABLE=1`` or
  ``TORCHDYNAMO_DISABLE=1`` turned every compile cell into a pass with nothing compiled (1.3 s instead of 10.9 s,
  reliability review 2026-11-28 defect 4); the others change what dynamo traces and inductor generates;
- ``TORCH_NCCL_*``: ProcessGroupNCCL's error handling and blocking wait decide whether a stuck collective raises,
  aborts or waits: a hang would be judged as another outcome;
- ``TORCH_FORCE_*``: ``TORCH_FORCE_(NO_)WEIGHTS_ONLY_LOAD`` flips what every ``torch.load`` of a checkpoint cell does.

The batched runner is not ``accelerate launch``: a cell that wants one of these sets it itself, and
``Launcher.env`` sets one on purpose."""
STRIPPED_ENV_NAMES = (
    "CUDA_LAUNCH_BLOCKING",
    "TORCH_DISTRIBUTED_DEBUG",
    "TORCH_SHOW_CPP_STACKTRACES",
    "TORCH_USE_CUDA_DSA",
    "NCCL_BLOCKING_WAIT",
    "NCCL_ASYNC_ERROR_HANDLING",
    "NCCL_DESYNC_DEBUG",
)
"""Single variables stripped for the same reason: ``CUDA_LAUNCH_BLOCKING`` makes every kernel synchronous (an
asynchronous CUDA error surfaces at another call, a race disappears); ``TORCH_DISTRIBUTED_DEBUG`` wraps the process
group in one that checks every collective first (a mismatch raises its own error, earlier); the C++ stack traces and
device-side assertions change the error text the rules match; the ``NCCL_*`` three are torch's older spellings of
``TORCH_NCCL_*``. The rest of ``NCCL_*`` and ``GLOO_*`` passes: socket interfaces, InfiniBand and P2P transports are
the machine's, a run may need them to start at all, and they change how bytes move, not which collectives FSDP calls
or what a cell computes."""
KEPT_ENV = (ENV_LAUNCH, ENV_DEVICE, ENV_SHARE_GPU)
"""Ours, though they match no prefix above; everything else (RANK, WORLD_SIZE, MASTER_*, the socket-interface
variables GLOO_/NCCL_/TP_SOCKET_IFNAME, the HF_* offline settings, OMP_NUM_THREADS, ...) passes through."""


def stripped(name: str) -> bool:
    """Is the caller's variable ``name`` kept from the ranks (STRIPPED_ENV_PREFIXES, STRIPPED_ENV_NAMES)? The
    harness's own (``FSDP_MATRIX_*``, KEPT_ENV) never are."""
    if name.startswith("FSDP_MATRIX_") or name in KEPT_ENV:
        return False
    return name.startswith(STRIPPED_ENV_PREFIXES) or name in STRIPPED_ENV_NAMES


def launch_environ(base: Dict[str, str]) -> Tuple[Dict[str, str], List[str]]:
    """The ranks' environment from the caller's ``base``, and the names removed (for the records)."""
    removed = sorted(k for k in base if stripped(k))
    return {k: v for k, v in base.items() if k not in removed}, removed


def task_file(seq: int) -> str:
    """Task file number ``seq``, in TASKS."""
    return f"{seq:05d}.json"


def events_file(local_rank: int) -> str:
    """A rank's event file: per local rank, so each node's launcher watches only the ranks it started."""
    return f"rank{local_rank}.jsonl"


def stack_file(local_rank: int) -> str:
    """Where a rank's faulthandler dumps every thread's stack on SIGUSR1."""
    return f"stack-rank{local_rank}.txt"


# ---- launcher -> ranks --------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class LaunchConfig:
    """What every rank of a launch needs to know before its first task."""

    scratch: str
    """Folder shared by the ranks of this node, and by no other node's (e.g. a tiny model this node's local rank 0
    saves for the others): each node of a multi-node launch has its own, as each machine would."""
    seed: int
    """Seed every rank sets before each cell."""
    cell_timeout: float
    """Seconds a cell may run; also the process group's timeout, so a stuck collective raises on a waiting rank."""
    barrier_timeout: float
    """Seconds the between-cell barrier waits for the other ranks."""
    leak_budget_mb: int
    """Memory that modules left alive by cells may hold before the launch retires."""
    coordinator: int
    """pid of the process that started the launch: when it is gone, the ranks stop."""
    coordinator_create_time: float
    """Its create time (psutil): with the pid it names that process, not a later one that reuses the pid."""
    shared: str = ""
    """Folder every rank of the launch sees, over all its nodes (checkpoints written by one rank and read by all);
    empty when the ranks share none (one node of a rendezvous of several machines)."""
    preload: List[str] = field(default_factory=list)
    """Repro scripts of the cells queued when the launch starts: each rank imports them (and so the libraries they
    import) before it says Ready, so that import time is the launch's, not the first cell's (a rule's short hang
    timeout must not be spent importing peft). A repro that fails to import is left to its own cell to report."""


def encode_config(config: LaunchConfig) -> str:
    return json.dumps(asdict(config))


def decode_config(text: str) -> LaunchConfig:
    data = json.loads(text)
    known = {f.name for f in fields(LaunchConfig)}
    return LaunchConfig(**{k: v for k, v in data.items() if k in known})


@dataclass(frozen=True)
class Task:
    """Run one cell."""

    key: str
    """``case/cell``."""
    repro: str
    """Absolute path of the repro script whose ``run`` the ranks call."""
    params: Dict[str, Any]
    """The cell's axis values."""
    timeout_s: Optional[float] = None
    """Seconds this cell may run before it is declared hung; None: the launcher's ``cell_timeout`` (a rule that
    expects a hang sets a short one)."""
    op: str = "cell"


@dataclass(frozen=True)
class Stop:
    """Leave the task loop, destroy the process group and exit 0."""

    why: str = "stop"
    """Said back in the rank's ``Bye``."""
    op: str = "stop"


Order = Union[Task, Stop]


def encode_order(order: Order) -> str:
    return json.dumps(asdict(order))


def decode_order(text: str) -> Order:
    data = json.loads(text)
    op = data.pop("op", None)
    if op == "cell":
        return Task(**data)
    if op == "stop":
        return Stop(**data)
    raise ValueError(f"unknown task op {op!r}")


# ---- ranks -> launcher --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Hello:
    """The rank process is up (before imports and rendezvous): its pid, for stack dumps and kills."""

    pid: int
    """The rank's process id."""
    rank: int
    """Its global rank."""
    create_time: float = 0.0
    """The process's start time (psutil): with the pid it names this process and no later one that reuses the pid."""
    t: float = field(default_factory=time.time)
    event: str = "hello"


@dataclass(frozen=True)
class Ready:
    """Imports done, process group up: the rank takes tasks now."""

    pid: int
    """The rank's process id."""
    t: float = field(default_factory=time.time)
    event: str = "ready"


@dataclass(frozen=True)
class Start:
    """The rank began a cell."""

    key: str
    """``case/cell``."""
    seq: int
    """Number of the task file."""
    t: float = field(default_factory=time.time)
    event: str = "start"


@dataclass(frozen=True)
class End:
    """The rank finished a cell, trained or raised: what it observed."""

    key: str
    """``case/cell``."""
    result: RankResult
    """Its status, error and checks."""
    t: float = field(default_factory=time.time)
    event: str = "end"


@dataclass(frozen=True)
class Clean:
    """After a cell, whether this rank is fit for the next one (see hygiene.Hygiene)."""

    key: str
    """The cell just finished."""
    clean: bool
    """False retires the launch after this cell."""
    problems: List[str]
    """What is wrong, one line each."""
    leaked_modules: int = 0
    """nn.Modules this cell left alive."""
    leaked_bytes: int = 0
    """Bytes of parameters they hold."""
    t: float = field(default_factory=time.time)
    event: str = "clean"


@dataclass(frozen=True)
class Bye:
    """The rank leaves its task loop and exits 0."""

    why: str
    """``stop``, ``coordinator gone``, or why it is not clean."""
    retire: bool = False
    """True when the launch must be replaced (the rank was not clean)."""
    t: float = field(default_factory=time.time)
    event: str = "bye"


Event = Union[Hello, Ready, Start, End, Clean, Bye]
EVENTS = {cls.__dataclass_fields__["event"].default: cls for cls in (Hello, Ready, Start, End, Clean, Bye)}


def encode_event(event: Event) -> str:
    return json.dumps(asdict(event), default=str)


def decode_event(text: str) -> Event:
    """One line of a rank's event file. Raises ValueError on anything that is not a known event."""
    data = json.loads(text)
    if not isinstance(data, dict) or data.get("event") not in EVENTS:
        raise ValueError(f"not a rank event: {text[:200]!r}")
    cls = EVENTS[data["event"]]
    known = {f.name for f in fields(cls)}
    data = {k: v for k, v in data.items() if k in known}
    if cls is End:
        data["result"] = RankResult.from_json(data["result"])
    return cls(**data)
