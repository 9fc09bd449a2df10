"""What a rank must look like between cells for the next cell to be unaffected by the last one."""

from __future__ import annotations

import gc
import os
import warnings
from datetime import timedelta
from typing import Any, Dict, Tuple

from fsdp_matrix.clip import clip

# libraries export some settings on first use (torch's inductor cache dir): a cell may add those once
_FIRST_USE_ENV = ("TORCHINDUCTOR_", "TRITON_", "KMP_", "CUDA_MODULE_LOADING")


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

        return {
            "default_dtype": str(torch.get_default_dtype()),
            "grad_enabled": torch.is_grad_enabled(),
            "deterministic": torch.are_deterministic_algorithms_enabled(),
            "cwd": os.getcwd(),
            "environ": dict(os.environ),
        }

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
            problems.append(
                f"leaked modules hold {self.leaked_bytes >> 20} MiB in this launch "
                f"(budget {self.budget >> 20} MiB; this cell left {modules})"
            )
        children = psutil.Process().children(recursive=True)
        # multiprocessing's resource tracker and similar helpers are ours to keep; anything else was leaked
        stray = [c for c in children if "resource_tracker" not in " ".join(_cmdline(c))]
        if stray:
            problems.append(
                "child processes left running: "
                + ", ".join(f"{c.pid} {clip(' '.join(_cmdline(c)), 60)}" for c in stray)
            )
            for child in stray:
                try:
                    child.kill()
                except psutil.NoSuchProcess:
                    pass  # it exited on its own since it was listed: gone is what we wanted
        now = self._global_state()
        changed = [k for k in now if k != "environ" and self.state[k] != now[k]]
        env_before, env_after = self.state["environ"], now["environ"]
        changed += [
            f"${k}"
            for k in sorted(set(env_before) | set(env_after))
            if env_before.get(k) != env_after.get(k) and not (k not in env_before and k.startswith(_FIRST_USE_ENV))
        ]
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
            problems.append(f"process group unusable: {type(exc).__name__}: {clip(str(exc), 300)}")
        if not problems:
            gc.freeze()  # what a clean cell left behind is measured already: stop re-scanning it every cell
        return {"clean": not problems, "problems": problems, "leaked_modules": modules, "leaked_bytes": size}


def _cmdline(proc: Any) -> list:
    try:
        return proc.cmdline()
    except Exception:  # noqa: BLE001 - the process may be gone already
        return []
