"""End to end: bisect the no-split-modules cell over the real peft releases 0.13.2 .. 0.15.2 and find PEFT
0.14.0 (PR #2167).

Every step installs a real env (uv, torch 2.13.0 CPU from the configured find-links) and runs the cell on a real
2-rank torchrun launch. Select it with ``-m bisect``; it needs the package index and takes minutes (see the timing
it prints). FSDP_MATRIX_BISECT_CACHE reuses step envs across runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fsdp_matrix.bisect.search import install_bound

ROOT = Path(__file__).resolve().parents[2]
CELL = "no-split-modules/lora-orig0-cls_env_unset-shape_plain-ws2"
SEED_ERROR = "Could not find the transformer layer class to wrap"


@pytest.mark.bisect
@pytest.mark.heavy  # a real release bisect: one env install and launch per step (nox -s heavy)
@pytest.mark.timeout(1500)
def test_bisect_finds_the_peft_release_that_fixed_seed_003(tmp_path: Path) -> None:
    cache = Path(os.environ.get("FSDP_MATRIX_BISECT_CACHE") or tmp_path / "envs")
    out = tmp_path / "bisect.json"
    cmd = [
        sys.executable,
        "-m",
        "fsdp_matrix",
        "bisect",
        CELL,
        "--package",
        "peft",
        "--old",
        "0.13.2",
        "--new",
        "0.15.2",
        "--combo",
        "old",
        "--cache",
        str(cache),
        "--json",
        str(out),
    ]
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1400)
    took = time.monotonic() - start
    print(proc.stdout, proc.stderr[-3000:], sep="\n")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    steps = {s["candidate"]: s for s in result["steps"]}
    print(
        f"bisect took {took:.0f}s, {len(result['steps'])} installs: "
        + ", ".join(f"{s['candidate']} {s['seconds']:.0f}s" for s in result["steps"])
    )

    assert result["candidates"] == ["0.13.2", "0.14.0", "0.15.0", "0.15.1", "0.15.2"]
    assert (result["first_changed"], result["last_unchanged"]) == ("0.14.0", "0.13.2")
    assert result["answer"].startswith("first changed: peft 0.14.0 (last unchanged: 0.13.2)")
    # it changed for the right reason: the seed error before, a clean training run after
    old = steps["0.13.2"]["outcome"]
    assert old["status"] == "error" and old["error_type"] == "Exception" and SEED_ERROR in old["message"]
    fixed = steps["0.14.0"]["outcome"]
    assert {k: fixed[k] for k in ("status", "error_type", "message")} == {
        "status": "ok",
        "error_type": None,
        "message": "",
    }
    assert all(s["installed"] for s in result["steps"])
    assert len(result["steps"]) <= install_bound(5)
