"""Two ranks on one GPU: the platform facts a single-GPU machine can give about the layouts that need two.

NCCL refuses two ranks of one communicator on one device: ``init.cc`` checks every peer's bus id and fails with
"Duplicate GPU detected : rank 1 and rank 0 both on CUDA device ..." (ncclInvalidUsage) when two peers share a host
hash and a bus id (https://github.com/NVIDIA/nccl/blob/master/src/init.cc; through torch's ProcessGroupNCCL as in
https://github.com/NVIDIA/nccl/issues/1241). So the harness's ``--device cuda`` (NCCL, ``cuda:LOCAL_RANK``) needs a
GPU per rank. Two ways around it are tried, each a fact to confirm, not a documented feature: a distinct
``NCCL_HOSTID`` per rank (the host hash differs, so the check passes and NCCL talks over its network transport), and
gloo with both ranks on ``cuda:0`` under FSDP1 and FSDP2 on a tiny model.
The harness itself pairs cuda with NCCL (fsdp_matrix/runner/worker.py), so a gloo layout that works here is a fact to
build on, not a cell the plan runs.

``python -m fsdp_matrix.device.probe --device cuda --out FILE`` runs each part as a 2-rank torchrun launch.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Dict, List, Optional

PART_TIMEOUT_S = 60
"""A part's whole launch; a hang in a collective counts as its outcome (the four parts: 4 minutes at worst)."""
PARTS = ("nccl", "nccl-hostid", "gloo-fsdp1", "gloo-fsdp2")


def _tiny(device: Any) -> Any:
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).to(device)


def _train_step(model: Any, device: Any) -> float:
    import torch

    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = model(torch.randn(8, 16, device=device)).pow(2).mean()
    loss.backward()
    opt.step()
    return float(loss.detach().cpu())


def dist_rank() -> int:
    return int(os.environ.get("RANK", 0))


def rank_part(part: str, device_name: str) -> Dict[str, Any]:
    """One rank's try of ``part``, every rank on device 0 (``cuda:0``, or the CPU when rehearsing)."""
    import torch
    import torch.distributed as dist

    device = torch.device("cuda", 0) if device_name == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if part == "nccl-hostid":
        os.environ["NCCL_HOSTID"] = f"fsdp-matrix-probe-rank{dist_rank()}"
    dist.init_process_group("gloo" if part.startswith("gloo") else "nccl", timeout=timedelta(seconds=60))
    if part.startswith("nccl"):
        t = torch.ones(1, device=device)
        dist.all_reduce(t)
        torch.cuda.synchronize()
        return {"all_reduce": float(t.item())}
    model = _tiny(device)
    if part == "gloo-fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        # device_id always, as fsdp_matrix/workload/wrapping.py gives it: on CPU FSDP1 refuses to run without it
        model = FSDP(model, device_id=device, use_orig_params=True)
    else:
        from torch.distributed.fsdp import fully_shard

        for layer in (model[0], model[2]):
            fully_shard(layer)
        fully_shard(model)
    return {"loss": _train_step(model, device)}


def _rank_main(part: str, device_name: str, out: Path) -> int:
    rank = dist_rank()
    try:
        result: Dict[str, Any] = {"rank": rank, "ok": True, **rank_part(part, device_name)}
    except BaseException as exc:  # the outcome is the fact: any error is recorded, not raised
        result = {"rank": rank, "ok": False, "error": f"{type(exc).__name__}: {str(exc).strip()[:600]}"}
    (out.parent / f"{out.name}.rank{rank}").write_text(json.dumps(result))
    os._exit(0)  # a failed NCCL communicator can hang the process group's teardown


TERM_GRACE_S = 10.0
"""How long a cut group has to end after SIGTERM (torchrun passes it to its ranks) before it is SIGKILLed."""
KILL_GRACE_S = 5.0
"""How long a SIGKILLed group may take to be gone."""


def run_group(argv: List[str], seconds: float, env: Optional[Dict[str, str]] = None, **kw: Any) -> Optional[int]:
    """Run ``argv`` in a process group of its own; at ``seconds`` SIGTERM the whole group (torchrun and its ranks
    too), SIGKILL what is left of it ``TERM_GRACE_S`` later. The exit code, or None when it was cut (and none of the
    group is left)."""
    import signal

    proc = subprocess.Popen(argv, env=env, start_new_session=True, **kw)
    try:
        proc.communicate(timeout=max(1.0, seconds))
        return proc.returncode
    except subprocess.TimeoutExpired:
        for sig, wait in ((signal.SIGTERM, TERM_GRACE_S), (signal.SIGKILL, KILL_GRACE_S)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            # the leader may end before the rest of its group has run its signal (a rank, a child of bash): the
            # group is cut when none of it is left, not when the leader is
            if _group_gone(proc, time.monotonic() + wait):
                break
        return None


def _group_gone(proc: subprocess.Popen[Any], deadline: float) -> bool:
    """Whether the leader ``proc`` has ended and no live process of its group is left, by ``deadline``. A zombie
    counts as gone: an orphan is reaped by whoever adopts it, which in a container may be nobody."""
    import psutil

    while time.monotonic() < deadline:
        proc.poll()
        if not any(_in_group(p, proc.pid) for p in psutil.process_iter(["status"])):
            return True
        time.sleep(0.05)
    return False


def _in_group(process: Any, pgid: int) -> bool:
    """Whether psutil's ``process`` is a live (not zombie) member of the process group ``pgid``."""
    try:
        return process.info["status"] != "zombie" and os.getpgid(process.pid) == pgid
    except (ProcessLookupError, PermissionError):
        return False


def run_part(part: str, device_name: str, scratch: Path) -> Dict[str, Any]:
    """Launch ``part`` on 2 ranks; its outcome from the ranks' files (or the launch's own end)."""
    out = scratch / part
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m",
            "fsdp_matrix.device.probe", "--part", part, "--device", device_name, "--out", str(out)]  # fmt: skip
    start = time.monotonic()
    log = out.parent / f"{out.name}.log"
    with open(log, "w") as fh:
        code = run_group(argv, PART_TIMEOUT_S, stdout=fh, stderr=subprocess.STDOUT)
    launch = f"hung: killed after {PART_TIMEOUT_S}s" if code is None else f"exit {code}"
    tail = log.read_text(errors="replace").strip().splitlines()[-3:]
    ranks = []
    for rank in (0, 1):
        path = out.parent / f"{out.name}.rank{rank}"
        ranks.append(json.loads(path.read_text()) if path.exists() else {"rank": rank, "ok": None})
    ok = all(r.get("ok") for r in ranks)
    return {"part": part, "ok": ok, "launch": launch, "seconds": round(time.monotonic() - start, 1), "ranks": ranks,
            "tail": tail if not ok else []}  # fmt: skip


def facts(device_name: str, scratch: Path, parts: List[str]) -> Dict[str, Any]:
    import platform

    import torch

    info: Dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version()}
    if device_name == "cuda" and torch.cuda.is_available():
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        nccl = getattr(torch.cuda, "nccl", None)
        info["nccl"] = ".".join(map(str, nccl.version())) if nccl and hasattr(nccl, "version") else None
    results = []
    for k, part in enumerate(parts, 1):
        if part.startswith("nccl") and device_name != "cuda":
            results.append({"part": part, "ok": None, "launch": "not run: NCCL needs CUDA"})
        else:
            results.append(run_part(part, device_name, scratch))
        print(f"[probe {k}/{len(parts)}] {part}: {json.dumps(results[-1])[:400]}", flush=True)
    return {"device": device_name, "date": time.strftime("%Y-%m-%d", time.gmtime()), **info, "parts": results}


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fsdp_matrix.device.probe", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    p.add_argument("--out", type=Path, required=True, help="the facts, as JSON")
    p.add_argument("--part", choices=PARTS, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.part:
        return _rank_main(args.part, args.device, args.out)
    scratch = args.out.parent / "probe"
    scratch.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(facts(args.device, scratch, list(PARTS)), indent=1) + "\n")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
