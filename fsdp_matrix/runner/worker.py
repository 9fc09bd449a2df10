"""The rank side of a batched launch: one process per rank, many cells per process.

torchrun starts ``python -m fsdp_matrix.runner.worker RUN_DIR`` on every rank. Each rank takes the launcher's
orders in turn and reports events back (see protocol.py); the launcher turns those into records.

Nothing raised by a cell escapes: it becomes the rank's observed error. Between cells the rank proves it is
clean (process group alive, no model or child process left over); if not, it says so and exits, and the launcher
continues the remaining cells in a fresh launch.
"""

from __future__ import annotations

import faulthandler
import hashlib
import importlib.util
import json
import os
import signal
import sys
import time
import traceback
import warnings
from datetime import timedelta
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Dict, List, Optional, Tuple

from fsdp_matrix.clip import clip
from fsdp_matrix.errors import ReproError
from fsdp_matrix.records import RankResult
from fsdp_matrix.runner import procs
from fsdp_matrix.runner.hygiene import Hygiene
from fsdp_matrix.runner.protocol import (
    ENV_DEVICE,
    ENV_SHARE_GPU,
    LAUNCH_JSON,
    TASKS,
    Bye,
    Clean,
    End,
    Event,
    Hello,
    LaunchConfig,
    Order,
    Ready,
    Start,
    Stop,
    Task,
    decode_config,
    decode_order,
    encode_event,
    events_file,
    stack_file,
    task_file,
)

POLL_S = 0.01
COORDINATOR_CHECK_S = 0.5
"""How often a rank waiting for its next task looks whether its coordinator is still there."""


def error_details(exc: BaseException) -> Dict[str, Optional[str]]:
    """Type, message, raising ``module.function`` and formatted traceback of an exception."""
    cls = type(exc)
    name = cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    tb = exc.__traceback__
    location = None
    while tb is not None:
        frame = tb.tb_frame
        location = f"{frame.f_globals.get('__name__', '?')}.{frame.f_code.co_name}"
        tb = tb.tb_next
    text = "".join(traceback.format_exception(cls, exc, exc.__traceback__))
    return {"error_type": name, "error_message": str(exc), "location": location, "traceback": text}


def _release(exc: BaseException) -> None:
    # a traceback keeps every frame alive, and with them the cell's model and optimizer
    tb = exc.__traceback__
    if tb is not None:
        traceback.clear_frames(tb)
    exc.__traceback__ = None


MAX_WARNINGS = 50
"""Distinct warnings kept per cell and rank (a warning raised every step is one entry with its count)."""


def _warnings(caught: List[warnings.WarningMessage]) -> List[Dict[str, Any]]:
    """One entry per (category, message), in the order first raised, with how often it was raised."""
    out: Dict[Tuple[str, str], Dict[str, Any]] = {}
    for w in caught:
        cls = w.category
        name = cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
        message = clip(str(w.message), 2000)
        key = (name, message)
        if key in out:
            out[key]["count"] += 1
        elif len(out) < MAX_WARNINGS:
            out[key] = {"category": name, "message": message, "filename": w.filename, "lineno": w.lineno, "count": 1}
    return list(out.values())


def run_cell(fn: Callable[[Dict[str, Any], Any], Any], params: Dict[str, Any], ctx: Any, rank: int) -> RankResult:
    """Run one cell on this rank and describe what happened, with the warnings run() raised (a rule may expect
    one, or its absence). Never raises (except KeyboardInterrupt)."""
    import torch

    torch.manual_seed(ctx.seed)
    start = time.monotonic()
    # "always": a warning an earlier cell of this process raised from the same line is this cell's warning too
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            checks = _checks(fn(dict(params), ctx))
            _world_kept(ctx)
            result = RankResult(rank=rank, status="ok", checks=checks)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # SystemExit from a cell is an observed outcome too
            result = RankResult(rank=rank, status="error", **error_details(exc))
            _release(exc)
            del exc
    result.warnings = _warnings(caught)
    result.duration_s = round(time.monotonic() - start, 4)
    return result


def _world_kept(ctx: Any) -> None:
    """CheckFailed unless the process group still has the world size the cell's id names: a cell that re-initialised
    it (or whose library did) ran in a world of its own, and every check it made holds trivially there (reliability
    review 2026-11-28, defect 3). Cells that train check it themselves too, before and after (workload/checks.py)."""
    from torch import distributed as dist

    promised = getattr(ctx, "world_size", None)
    have = dist.get_world_size() if dist.is_initialized() else 1
    if promised is not None and have != promised:
        from fsdp_matrix.errors import CheckFailed

        ranks = "rank" if have == 1 else "ranks"
        raise CheckFailed(f"world: the process group has {have} {ranks} after the cell, the cell's id names {promised}")


class ReturnError(TypeError):
    """``run()`` returned something that is not its checks: a dict with string keys, JSON-able (or None)."""


def _checks(returned: Any) -> Dict[str, Any]:
    """The checks a cell's ``run`` returned, or ReturnError: the End event that carries them must be readable, or
    the launcher could not tell this cell's outcome (nor any later cell's)."""
    if returned is None:
        return {}
    if not isinstance(returned, dict):
        raise ReturnError(f"run() returned {type(returned).__name__}, not a dict of checks (or None)")
    bad = [k for k in returned if not isinstance(k, str)]
    if bad:
        raise ReturnError(f"run() returned a dict with a {type(bad[0]).__name__} key {bad[0]!r}: keys must be str")
    try:
        json.dumps(returned, default=str)
    except (TypeError, ValueError) as exc:
        raise ReturnError(f"run() returned a dict that cannot be written as JSON: {exc}") from None
    return returned


def load_repro(path: str) -> ModuleType:
    """Import a repro script by path (repros/ is not a package: each script must also run alone). Modules are kept
    per resolved path: two repros that share a file name are two modules."""
    resolved = Path(path).resolve()
    name = f"fsdp_matrix_repro_{resolved.stem}_{hashlib.sha1(str(resolved).encode()).hexdigest()[:10]}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, resolved)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]  # a half-run module must not be found by the next cell as if it had loaded
        raise
    return module


def preload(paths: List[str]) -> None:
    """Import the repros a launch starts with, as part of the launch (its per-launch cost), not inside their first
    cell. Only what they import is paid: a launch of the harness's toy repros no longer imports peft and
    transformers (about 8 s of CPU per rank on 2 cores). A repro that fails here fails again in its own cell, which
    reports it (load_repro keeps no half-run module)."""
    for path in paths:
        try:
            load_repro(path)
        except KeyboardInterrupt:
            raise
        except BaseException:  # SystemExit and the rest at import: its cell's error, reported there
            pass


def load_run(path: str) -> Callable[[Dict[str, Any], Any], Any]:
    """The repro's ``run``, or a ReproError that names the file: missing, not importable, or without ``run``."""
    try:
        module = load_repro(path)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # SyntaxError, ImportError, SystemExit at import...: this cell's error
        raise ReproError(f"cannot load repro {path}: {type(exc).__name__}: {exc}") from exc
    fn = getattr(module, "run", None)
    if not callable(fn):
        raise ReproError(f"repro {path} defines no run(params, ctx) function")
    return fn


def run_task(task: Task, ctx: Any, rank: int) -> RankResult:
    """One cell from its task: load the repro, then run it. A repro that cannot be loaded is this cell's error on
    every rank alike (they all load it), so the launch goes on to the next cell. Never raises."""
    start = time.monotonic()
    try:
        fn = load_run(task.repro)
    except ReproError as exc:
        result = RankResult(rank=rank, status="error", **error_details(exc))
        result.duration_s = round(time.monotonic() - start, 4)
        return result
    return run_cell(fn, task.params, ctx, rank)


def make_context(scratch: Path, seed: int = 0, shared: Optional[Path] = None) -> Any:
    import torch

    from fsdp_matrix.workload.context import RankContext

    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    cuda = os.environ.get(ENV_DEVICE, "cpu") == "cuda"
    device = torch.device("cuda", cuda_index(local_rank)) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    return RankContext(
        rank=int(os.environ.get("RANK", 0)),
        world_size=int(os.environ.get("WORLD_SIZE", 1)),
        local_rank=local_rank,
        device=device,
        backend="nccl" if cuda else "gloo",
        scratch=scratch,
        seed=seed,
        shared=shared,
        local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", 0)) or None,
    )


def cuda_index(local_rank: int) -> int:
    """The GPU of this rank: its local rank, or under ``run --share-gpu`` with fewer GPUs than ranks, local rank mod
    GPUs, with a host id of its own (``NCCL_HOSTID``). NCCL refuses two ranks of one communicator on one device
    ("Duplicate GPU detected", init.cc, https://github.com/NVIDIA/nccl/issues/1241) only when they share a host hash;
    with distinct ones it talks over its network transport (fsdp_matrix/device/probe.py saw both on an H200)."""
    import torch

    count = torch.cuda.device_count()
    ranks = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    if os.environ.get(ENV_SHARE_GPU) != "1" or count == 0 or ranks <= count:
        return local_rank
    os.environ["NCCL_HOSTID"] = f"fsdp-matrix-rank{local_rank}"
    return local_rank % count


def init_process_group(ctx: Any, timeout_s: float) -> None:
    import torch.distributed as dist

    # the process group's own timeout turns a stuck collective into an error on the waiting rank
    dist.init_process_group(ctx.backend, timeout=timedelta(seconds=timeout_s))


class EventLog:
    """This rank's append-only event file; each line is flushed so the launcher sees it at once."""

    def __init__(self, path: Path) -> None:
        self.fh = open(path, "a", encoding="utf-8", buffering=1)

    def write(self, event: Event) -> None:
        self.fh.write(encode_event(event) + "\n")
        self.fh.flush()


def next_order(run_dir: Path, seq: int, config: LaunchConfig) -> Order:
    """The next task file, waiting for it; Stop when the coordinator is gone (by pid and create time: its pid may
    belong to another process by now). The launch's watchdog covers a rank stuck inside a cell."""
    path = run_dir / TASKS / task_file(seq)
    checked = 0.0
    while not path.exists():
        if time.monotonic() - checked > COORDINATOR_CHECK_S:
            checked = time.monotonic()
            if procs.same_process(config.coordinator, config.coordinator_create_time) is None:
                return Stop("coordinator gone")
        time.sleep(POLL_S)
    return decode_order(path.read_text())


def main(run_dir: str) -> int:
    import psutil

    run = Path(run_dir)
    rank = int(os.environ.get("RANK", 0))
    # files are per local rank: on a multi-node run each node's launcher watches only the ranks it started
    local = int(os.environ.get("LOCAL_RANK", rank))
    log = EventLog(run / events_file(local))
    # a hung rank gets its stack dumped here when the launcher sends SIGUSR1; a segfault dumps to stderr
    stacks = open(run / stack_file(local), "w")
    faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
    faulthandler.enable()
    config = decode_config((run / LAUNCH_JSON).read_text())
    log.write(Hello(pid=os.getpid(), rank=rank, create_time=psutil.Process().create_time()))
    preload(config.preload)
    ctx = make_context(Path(config.scratch), config.seed, Path(config.shared) if config.shared else None)
    init_process_group(ctx, config.cell_timeout)
    hygiene = Hygiene(config.leak_budget_mb << 20)
    log.write(Ready(pid=os.getpid()))
    seq = 0
    while True:
        order = next_order(run, seq, config)
        seq += 1
        if isinstance(order, Stop):
            log.write(Bye(why=order.why))
            break
        assert isinstance(order, Task)
        log.write(Start(key=order.key, seq=seq - 1))
        result = run_task(order, ctx, rank)
        # the result goes out before the hygiene barrier: if only this rank raised, the launcher learns it now,
        # not after the barrier times out
        log.write(End(key=order.key, result=result))
        state = hygiene.check(config.barrier_timeout)
        log.write(Clean(key=order.key, **state))
        if not state["clean"]:
            # exit 0 on purpose: this is a planned retirement, and torchrun must not report it as a failure
            log.write(Bye(why="not clean: " + "; ".join(state["problems"]), retire=True))
            break
    import torch.distributed as dist

    try:
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - a broken group is why we are retiring; exiting is what matters
        pass
    return 0


if __name__ == "__main__":
    from torch.distributed.elastic.multiprocessing.errors import record

    sys.exit(record(main)(sys.argv[1]))
