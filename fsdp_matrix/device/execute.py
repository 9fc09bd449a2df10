"""What ``run.sh`` runs once the sites are installed: the plan's steps for one call, each under its sites, within
the call's deadline; then the report, and at most 8 files in ``--out`` (the device tool returns no more).

Every step prints ``[step k/n] ... (elapsed)``; a step gets the time left before the deadline, less what the report
needs, so the call ends in time whatever a step does. A step not reached is named in the log, to be run with
``--steps`` in the next call.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from fsdp_matrix.device import image
from fsdp_matrix.device.plan import Plan, Step, load
from fsdp_matrix.device.probe import run_group
from fsdp_matrix.progress import fmt_seconds

REPORT_RESERVE_S = 40
"""Seconds kept back from the last step for the report and the files."""
LOGS_MAX_BYTES = 40 << 20
"""Bytes of the launches' logs packed (uncompressed): text logs compress several times over, so the tarball stays
under the device tool's 16 MiB a file."""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="run.sh", description="run a prepared device plan (docs/pages/gpu.md)")
    p.add_argument("--plan", type=Path, required=True, help="plan.json")
    p.add_argument("--out", type=Path, required=True, help="folder for the records, report and log (<= 8 files)")
    p.add_argument("--work", type=Path, required=True, help="scratch folder: sites/, results/")
    p.add_argument("--call", type=int, default=1, help="which call of the plan (default 1; 0: every step)")
    p.add_argument("--steps", default="", help="comma-separated step names (default: the call's)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    p.add_argument("--deadline", type=float, default=0, help="epoch seconds by which everything must be done")
    p.add_argument("--started", type=float, default=0, help="epoch seconds the call started (run.sh's start)")
    p.add_argument("--sample", type=int, default=0, help="run at most N cells of each step (0: all)")
    p.add_argument("--dry-run", action="store_true", help="print the steps and their sites; run nothing")
    return p


def chosen_steps(plan: Plan, call: int, names: str) -> List[Step]:
    """The steps to run: ``names`` (any call's), else call ``call``'s. ValueError (one line) for an unknown one."""
    if names:
        known = {s.name: s for s in plan.steps}
        wanted = [n.strip() for n in names.split(",") if n.strip()]
        bad = [n for n in wanted if n not in known]
        if bad or not wanted:
            raise ValueError(f"--steps {names}: no step {', '.join(bad) or '(none named)'}; have {', '.join(known)}")
        return [known[n] for n in wanted]
    if call == 0:  # the rehearsal: every step of every call, in order of value
        return list(plan.steps)
    if not 1 <= call <= len(plan.calls):
        raise ValueError(f"--call {call}: the plan has calls 1..{len(plan.calls)}")
    return [plan.step(n) for n in plan.calls[call - 1].steps]


def with_smoke(plan: Plan, steps: List[Step]) -> List[Step]:
    """The rehearsal's steps: ``steps`` and, per site they use, its smoke cell (plan.smoke) run on CPU."""
    used = [s.site for s in steps if s.kind == "cells"]
    extra = [
        Step(f"smoke-{site}", "cells", site, f"a cell that runs on CPU under site {site}: its imports", (cell,))
        for site, cell in plan.smoke.items()
        if site in used
    ]
    return steps + extra


def site_path(work: Path, site: str) -> str:
    """PYTHONPATH for a step in ``site``: its stack, front first."""
    return os.pathsep.join(str(work / "sites" / s) for s in image.stack(site))


def combo_for(plan: Plan, step: Step, device: str) -> str:
    """Records of the image's own packages are ``gpu-image``; a site of older versions adds its name."""
    base = plan.combo if device == "cuda" else f"{plan.combo}-rehearsal"
    suffix = image.site(step.site).records
    return f"{base}-{suffix}" if suffix else base


def step_argv(plan: Plan, step: Step, args: argparse.Namespace, cells: Sequence[str]) -> List[str]:
    if step.kind == "probe":
        return [sys.executable, "-m", "fsdp_matrix.device.probe", "--device", args.device,
                "--out", str(args.work / "platform-facts.json")]  # fmt: skip
    results = args.work / "results" / combo_for(plan, step, args.device)
    share = ["--share-gpu"] if step.share_gpu else []
    return [sys.executable, "-m", "fsdp_matrix", "run", "--device", args.device, "--world-size", str(step.world_size),
            *share, "--combo", combo_for(plan, step, args.device), "--results", str(results),
            "--cell-timeout", str(plan.cell_timeout_s), *cells]  # fmt: skip


def run_step(argv: List[str], env: Dict[str, str], seconds: float) -> str:
    """Run one step, its output passed through; ``ok``, ``exit N`` or ``cut at the deadline``. A cut step's whole
    process group goes (a harness run's ranks go with it: its launch watchdog kills them once it is gone)."""
    code = run_group(argv, seconds, env)
    if code is None:
        return "cut at the deadline (its records so far are kept; the rest: --steps with this step)"
    # `run` exits 1 when a verdict did not pass: the records say which, and the next step still runs
    if code == 1:
        return "exit 1 (a verdict needs attention: see the records)"
    return "ok" if code == 0 else f"exit {code}"


def run_steps(plan: Plan, steps: List[Step], args: argparse.Namespace, start: float) -> List[str]:
    """Every step in order while time is left; lines for the log's summary."""
    summary = []
    for k, step in enumerate(steps, 1):
        cells = list(step.cells[: args.sample] if args.sample else step.cells)
        where = f"{len(cells)} cell(s), site {step.site}" if step.kind == "cells" else "probe"
        left = (args.deadline or start + plan.budget_s) - time.time() - REPORT_RESERVE_S
        head = f"[step {k}/{len(steps)}] {step.name}: {step.why} ({where}; elapsed {fmt_seconds(time.time() - start)}"
        print(f"{head}, {fmt_seconds(max(0, left))} left)", flush=True)
        if args.dry_run:
            print(f"  PYTHONPATH={site_path(args.work, step.site)}\n  " + " ".join(step_argv(plan, step, args, cells)))
            continue
        if left < 15:
            summary.append(f"{step.name}: not reached (no time left); run it with --steps {step.name}")
            print(f"  {summary[-1]}", flush=True)
            continue
        env = {**os.environ, "PYTHONPATH": site_path(args.work, step.site), "PYTHONUNBUFFERED": "1"}
        t0 = time.time()
        outcome = run_step(step_argv(plan, step, args, cells), env, left)
        summary.append(f"{step.name}: {outcome} after {fmt_seconds(time.time() - t0)}")
        print(f"[step {k}/{len(steps)}] {summary[-1]} (elapsed {fmt_seconds(time.time() - start)})", flush=True)
    return summary


def environment(device: str) -> Dict[str, object]:
    """What the run ran on: python, the packages under test as each site sees them, torch, CUDA and the driver."""
    import platform

    info: Dict[str, object] = {"python": platform.python_version(), "machine": platform.machine(), "device": device}
    smi = shutil.which("nvidia-smi")
    if smi:
        query = [smi, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]
        info["nvidia_smi"] = subprocess.run(query, capture_output=True, text=True).stdout.strip()
    return info


SITE_CHECK = """
import importlib, importlib.metadata as m, json
out = {}
# transformers.trainer, not transformers: it imports datasets where one is installed (a datasets that wants another
# huggingface-hub fails there, as base's 5.2.0 did under the old site's hub 0.36)
for dist, module in (("torch", "torch"), ("transformers", "transformers.trainer"), ("accelerate", "accelerate"),
                     ("peft", "peft"), ("bitsandbytes", "bitsandbytes"), ("trl", "trl"), ("tokenizers", None),
                     ("huggingface-hub", None), ("pydantic", "pydantic")):
    try:
        out[dist] = m.version(dist)
    except m.PackageNotFoundError:
        out[dist] = None
        continue
    try:
        module and importlib.import_module(module)
    except Exception as exc:
        out[dist] += f" (import failed: {type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''})"
import torch
out.update({"torch.version.cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available(),
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None})
print(json.dumps(out))
"""
"""Each site's versions, and whether each package imports there (a missing wheel shows here first)."""


def _last_json(text: str) -> Optional[Dict[str, object]]:
    # an import may print to stdout (bitsandbytes does): the check's own line is the last
    for line in reversed(text.strip().splitlines()):
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if isinstance(data, dict):
            return data
    return None


def site_versions(work: Path, sites: Sequence[str]) -> Dict[str, object]:
    """Each site's view of the packages under test and of torch's CUDA: a subprocess per site (its own sys.path), all
    at once (each imports transformers.trainer: seconds apiece)."""
    procs = {}
    for site in sites:
        env = {**os.environ, "PYTHONPATH": site_path(work, site)}
        argv = [sys.executable, "-c", SITE_CHECK]
        procs[site] = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out: Dict[str, object] = {}
    for k, (site, proc) in enumerate(procs.items(), 1):
        try:
            stdout, stderr = proc.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
        out[site] = _last_json(stdout) or {"site_check_failed": (stderr.strip().splitlines() or ["-"])[-1]}
        print(f"[site {k}/{len(sites)}] {site}: {json.dumps(out[site])}", flush=True)
    return out


def report(work: Path, out: Path) -> str:
    """The combined report of this run's records, as report.md in ``out``."""
    results = work / "results"
    if not any(results.rglob("cells.jsonl")):
        return "no records: no report"
    argv = [
        sys.executable,
        "-m",
        "fsdp_matrix",
        "report",
        str(results),
        "--out",
        str(work / "report"),
        "--format",
        "md",
    ]
    done = subprocess.run(argv, env={**os.environ, "PYTHONPATH": site_path(work, "harness")}, timeout=120)
    if (work / "report" / "report.md").exists():
        shutil.copy(work / "report" / "report.md", out / "report.md")
    return f"report: exit {done.returncode}"


def collect(work: Path, out: Path, plan_path: Path) -> List[str]:
    """plan.json, the records (one file per combo), the probe's facts and the launches' logs into ``out``; the log
    (run.log) and env.json are written there by run.sh and main. Eight files at most."""
    written = []
    shutil.copy(plan_path, out / "plan.json")
    for records in sorted((work / "results").glob("*/cells.jsonl")):
        shutil.copy(records, out / f"cells-{records.parent.name}.jsonl")
    if (work / "platform-facts.json").exists():
        shutil.copy(work / "platform-facts.json", out / "platform-facts.json")
    logs = [p for p in (work / "results").rglob("*") if p.is_file() and p.name != "cells.jsonl"]
    if logs:
        with tarfile.open(out / "launches.tar.gz", "w:gz") as tar:
            for path in sorted(logs, key=lambda p: p.stat().st_size):
                if sum(t.size for t in tar.getmembers()) + path.stat().st_size > LOGS_MAX_BYTES:
                    break
                tar.add(path, arcname=str(path.relative_to(work)))
    for path in sorted(out.iterdir()):
        written.append(f"{path.name} ({path.stat().st_size / 1024:.0f} KiB)")
    return written


def main(argv: Optional[List[str]] = None) -> int:
    args = parser().parse_args(argv)
    start = args.started or time.time()
    try:
        plan = load(args.plan.read_text())
        steps = chosen_steps(plan, args.call, args.steps)
    except (OSError, ValueError) as exc:
        print(f"run.sh: {exc}", file=sys.stderr)
        return 2
    if args.device == "cpu":
        steps = with_smoke(plan, steps)
    sites = [s for s in image.SITES if any(s.name in image.stack(step.site) for step in steps)]
    print(f"{len(steps)} step(s) on {args.device}: {', '.join(s.name for s in steps)}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    info = {"environment": environment(args.device)}
    if not args.dry_run:
        info["sites"] = site_versions(args.work, [s.name for s in sites])
    info["summary"] = run_steps(plan, steps, args, start)
    if not args.dry_run:
        info["summary"].append(report(args.work, args.out))
        (args.out / "env.json").write_text(json.dumps(info, indent=1) + "\n")
        print("files in --out: " + ", ".join(collect(args.work, args.out, args.plan)), flush=True)
    print("\n".join(["summary:", *(f"  {line}" for line in info["summary"])]), flush=True)
    print(f"done in {fmt_seconds(time.time() - start)}", flush=True)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
