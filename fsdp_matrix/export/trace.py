"""Run an exported script once on its ranks under a line tracer: which of its lines the cell reached, and where it
raised. prune.py keeps only those lines.

Each rank loads the script as a module (its ``__main__`` blocks stay idle) and calls its own ``rank_main`` with
``run`` traced: every line of the script that runs inside ``run`` is recorded, with the script's frames of the
traceback when ``run`` raises. The launch goes through torchrun, as the script's own would.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional

from fsdp_matrix.export.launch import OUTCOME_ENV, SCRATCH_ENV
from fsdp_matrix.export.prune import Trace
from fsdp_matrix.progress import Heartbeat

NEEDS = ("torch", "peft", "transformers")
"""What the tracing interpreter must import for a cell to run at all."""

TRACER = """
import json, os, runpy, sys, traceback, types
script, out = os.path.abspath(sys.argv[1]), sys.argv[2]
sys.argv = [script] + sys.argv[3:]
g = runpy.run_path(script, run_name="__fsdp_matrix_trace__")
# importable by its name, as __main__ is in a plain run: a broadcast object of the script's own class pickles
module = sys.modules["__fsdp_matrix_trace__"] = types.ModuleType("__fsdp_matrix_trace__")
module.__dict__.update(g)
lines, raised = set(), []


def local(frame, event, arg):
    if event == "line":
        lines.add(frame.f_lineno)
    return local


def scope(frame, event, arg):
    return local if frame.f_code.co_filename == script else None


def traced(params, ctx):
    sys.settrace(scope)
    try:
        return g["run"](params, ctx)
    except BaseException as exc:
        raised.append([f.lineno for f in traceback.extract_tb(exc.__traceback__) if f.filename == script])
        raise
    finally:
        sys.settrace(None)
        with open(os.path.join(out, "trace-%s.json" % os.environ["RANK"]), "w") as f:
            json.dump({"lines": sorted(lines), "raised": raised}, f)


sys.exit(g["rank_main"](traced, g["RankContext"], g["PARAMS"], g["PINS"], sys.argv[1:], g["DEVICE"], g["WORLD_SIZE"]))
"""


def can_trace(python: str = sys.executable) -> bool:
    """Whether ``python`` (this interpreter: checked by import specs) has the packages a cell needs."""
    if python != sys.executable:
        return True
    return all(importlib.util.find_spec(name) is not None for name in NEEDS)


def trace_script(
    text: str, world_size: int, device: str, python: str = sys.executable, timeout: float = 600
) -> Optional[Trace]:
    """Run the script ``text`` once under the tracer; None when no rank wrote a trace (the message says why)."""
    with tempfile.TemporaryDirectory(prefix="fsdp-export-") as tmp, Heartbeat("export", "tracing the cell") as beat:
        tmp_path = Path(tmp)
        script, tracer = tmp_path / "script.py", tmp_path / "tracer.py"
        script.write_text(text, encoding="utf-8")
        tracer.write_text(TRACER, encoding="utf-8")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "TORCHELASTIC", "MASTER_"))}
        env.update({OUTCOME_ENV: str(tmp_path / "outcome"), SCRATCH_ENV: str(tmp_path / "scratch")})
        cmd = [python, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world_size}"]
        cmd += [str(tracer), str(script), tmp, "--device", device]
        beat.say(f"tracing the cell on {world_size} ranks ({device})")
        try:
            proc = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            beat.say(f"the traced run took over {timeout:.0f} s: kept every reachable line")
            return None
        files = sorted(tmp_path.glob("trace-*.json"))
        if not files:
            tail = (proc.stdout + proc.stderr).strip().splitlines()[-3:]
            beat.say("the traced run wrote no trace: kept every reachable line; " + " | ".join(tail))
            return None
        trace = Trace(set())
        for path in files:
            data = json.loads(path.read_text())
            trace.lines |= set(data["lines"])
            trace.raised += data["raised"]
        trace.outcome = next((x for x in proc.stdout.splitlines() if x.startswith("===== outcome:")), "")
        beat.say(f"traced: {len(trace.lines)} lines ran; {trace.outcome.removeprefix('===== ') or 'no outcome'}")
        return trace
