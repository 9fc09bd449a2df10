"""The rank side of a batched launch: one process per rank, many cells per process.

torchrun starts ``python -m fsdp_matrix.worker RUN_DIR`` on every rank. Each rank then takes tasks
``RUN_DIR/tasks/00000.json, 00001.json, ...`` in order, as the launcher writes them, so all ranks run the same
cells in the same order without a collective to agree on it. Per cell, each rank appends ``start`` and ``end``
events to ``RUN_DIR/rank<r>.jsonl``; the launcher turns those into records.

Nothing raised by a cell escapes: it becomes the rank's observed error. Between cells the rank proves it is
clean (process group alive, no model or child process left over); if not, it says so and exits, and the launcher
continues the remaining cells in a fresh launch.
"""

from __future__ import annotations

import faulthandler
import gc
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
from typing import Any, Callable, Dict, Optional, Tuple

from fsdp_matrix.records import RankResult

TASKS = "tasks"
_FIRST_USE_ENV = ("TORCHINDUCTOR_", "TRITON_", "KMP_", "CUDA_MODULE_LOADING")
POLL_S = 0.01


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


def run_cell(fn: Callable[[Dict[str, Any], Any], Any], params: Dict[str, Any], ctx: Any, rank: int) -> RankResult:
    """Run one cell on this rank and describe what happened. Never raises (except KeyboardInterrupt)."""
    import torch

    torch.manual_seed(ctx.seed)
    start = time.monotonic()
    try:
        checks = fn(dict(params), ctx) or {}
        result = RankResult(rank, "ok", checks=checks)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # SystemExit from a cell is an observed outcome too
        result = RankResult(rank, "error", **error_details(exc))
        _release(exc)
        del exc
    result.duration_s = round(time.monotonic() - start, 4)
    return result


def load_repro(path: str) -> ModuleType:
    """Import a repro script by path (repros/ is not a package: each script must also run alone)."""
    name = "fsdp_matrix_repro_" + Path(path).stem
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def make_context(scratch: Path, seed: int = 0) -> Any:
    import torch

    from fsdp_matrix.workload.context import RankContext

    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    cuda = os.environ.get("FSDP_MATRIX_DEVICE", "cpu") == "cuda"
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    return RankContext(rank=int(os.environ.get("RANK", 0)), world_size=int(os.environ.get("WORLD_SIZE", 1)),
                       local_rank=local_rank, device=device, backend="nccl" if cuda else "gloo",
                       scratch=scratch, seed=seed)


def init_process_group(ctx: Any, timeout_s: float) -> None:
    import torch.distributed as dist

    # the process group's own timeout turns a stuck collective into an error on the waiting rank
    dist.init_process_group(ctx.backend, timeout=timedelta(seconds=timeout_s))


class Hygiene:
    """What a rank must look like between cells for the next cell to be unaffected by this one.

    FSDP1 keeps each flat parameter (and through it the wrapped modules) alive from C++ after the model is gone,
    so "no nn.Module left" cannot be the test: every FSDP1 cell would fail it. Leaked modules and their bytes are
    measured and reported; the launch is retired when they exceed a memory budget, and at once for what really
    leaks into the next cell: child processes, a broken process group, changed global torch state or environment.
    """

    def __init__(self, leak_budget_bytes: int = 512 << 20) -> None:
        gc.collect()
        # everything alive now (torch, transformers, peft...) is permanent: later collections and leak scans then
        # only walk what cells created, ~100x fewer objects (0.5 s -> a few ms per cell)
        gc.freeze()
        self.budget = leak_budget_bytes
        self.leaked_bytes = 0
        self.state = self._global_state()

    @staticmethod
    def _global_state() -> Dict[str, Any]:
        import torch

        return {"default_dtype": str(torch.get_default_dtype()), "grad_enabled": torch.is_grad_enabled(),
                "deterministic": torch.are_deterministic_algorithms_enabled(), "cwd": os.getcwd(),
                "environ": dict(os.environ)}

    @staticmethod
    def _leaked_modules() -> Tuple[int, int]:
        import torch

        count, size = 0, 0
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # isinstance probes deprecated torch objects, which warn
            for obj in gc.get_objects():
                if isinstance(obj, torch.nn.Module):
                    count += 1
                    size += sum(p.numel() * p.element_size() for p in obj.parameters(recurse=False))
        return count, size

    def check(self, barrier_timeout_s: float) -> Dict[str, Any]:
        import psutil
        import torch
        import torch.distributed as dist

        gc.collect()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        problems = []
        modules, size = self._leaked_modules()
        # frozen after each clean cell, so a scan sees only this cell's leftovers: the total is the running sum
        self.leaked_bytes += size
        if self.leaked_bytes > self.budget:
            problems.append(f"leaked modules hold {self.leaked_bytes >> 20} MiB in this launch "
                            f"(budget {self.budget >> 20} MiB; this cell left {modules})")
        children = psutil.Process().children(recursive=True)
        # multiprocessing's resource tracker and similar helpers are ours to keep; anything else was leaked
        stray = [c for c in children if "resource_tracker" not in " ".join(_cmdline(c))]
        if stray:
            problems.append("child processes left running: " + ", ".join(f"{c.pid} {' '.join(_cmdline(c))[:60]}" for c in stray))
            for child in stray:
                child.kill()
        now = self._global_state()
        changed = [k for k in now if k != "environ" and self.state[k] != now[k]]
        env_before, env_after = self.state["environ"], now["environ"]
        changed += [f"${k}" for k in sorted(set(env_before) | set(env_after))
                    if env_before.get(k) != env_after.get(k) and not (k not in env_before and k.startswith(_FIRST_USE_ENV))]
        # libraries export some settings on first use (torch's inductor cache dir): accept those once
        self.state["environ"] = {k: v for k, v in env_after.items() if k in env_before or k.startswith(_FIRST_USE_ENV)}
        if changed:
            problems.append("global state changed by the cell: " + ", ".join(changed))
        try:
            if dist.get_backend() == "gloo":
                dist.monitored_barrier(timeout=timedelta(seconds=barrier_timeout_s))
            # every rank must retire together, or the clean ones would start a cell the dirty ones never join
            flag = torch.tensor([1.0 if problems else 0.0], device="cuda" if dist.get_backend() == "nccl" else "cpu")
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            if flag.item() and not problems:
                problems.append("another rank is not clean")
        except Exception as exc:  # noqa: BLE001 - any failure here means the group is unusable
            problems.append(f"process group unusable: {type(exc).__name__}: {str(exc)[:300]}")
        if not problems:
            gc.freeze()  # what a clean cell left behind is measured already: stop re-scanning it every cell
        return {"clean": not problems, "problems": problems,
                "leaked_modules": modules, "leaked_bytes": size}


def _cmdline(proc: Any) -> list:
    try:
        return proc.cmdline()
    except Exception:  # noqa: BLE001 - the process may be gone already
        return []


class EventLog:
    """This rank's append-only event file; each line is flushed so the launcher sees it at once."""

    def __init__(self, path: Path) -> None:
        self.fh = open(path, "a", encoding="utf-8", buffering=1)

    def write(self, **event: Any) -> None:
        event.setdefault("t", time.time())
        self.fh.write(json.dumps(event, default=str) + "\n")
        self.fh.flush()


def next_task(run_dir: Path, seq: int, coordinator: int) -> Dict[str, Any]:
    path = run_dir / TASKS / f"{seq:05d}.json"
    while not path.exists():
        if coordinator and not _alive(coordinator):
            return {"op": "stop", "why": "coordinator gone"}
        time.sleep(POLL_S)
    return json.loads(path.read_text())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def main(run_dir: str) -> int:
    run = Path(run_dir)
    rank = int(os.environ.get("RANK", 0))
    # files are per local rank: on a multi-node run each node's launcher watches only the ranks it started
    local = int(os.environ.get("LOCAL_RANK", rank))
    log = EventLog(run / f"rank{local}.jsonl")
    # a hung rank gets its stack dumped here when the launcher sends SIGUSR1; a segfault dumps to stderr
    stack_file = open(run / f"stack-rank{local}.txt", "w")
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    faulthandler.enable()
    config = json.loads((run / "launch.json").read_text())
    log.write(event="hello", pid=os.getpid(), rank=rank)
    # import the workload stack now, as part of the launch (the per-launch cost), not inside the first cell
    import fsdp_matrix.workload.recipe  # noqa: F401

    ctx = make_context(Path(config["scratch"]), config.get("seed", 0))
    init_process_group(ctx, config["cell_timeout"])
    hygiene = Hygiene(int(config.get("leak_budget_mb", 512)) << 20)
    log.write(event="ready", pid=os.getpid())
    seq = 0
    while True:
        task = next_task(run, seq, config.get("coordinator", 0))
        seq += 1
        if task["op"] == "stop":
            log.write(event="bye", why=task.get("why", "stop"))
            break
        log.write(event="start", key=task["key"], seq=seq - 1)
        fn = load_repro(task["repro"]).run
        result = run_cell(fn, task["params"], ctx, rank)
        # the result goes out before the hygiene barrier: if only this rank raised, the launcher learns it now,
        # not after the barrier times out
        log.write(event="end", key=task["key"], result=result.__dict__)
        state = hygiene.check(config.get("barrier_timeout", 30))
        log.write(event="clean", key=task["key"], **state)
        if not state["clean"]:
            # exit 0 on purpose: this is a planned retirement, and torchrun must not report it as a failure
            log.write(event="bye", why="not clean: " + "; ".join(state["problems"]), retire=True)
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
