"""The real rehearsal: ``--prepare`` from the package index, then ``run.sh --rehearse`` on CPU with the image's
versions. Downloads about 60 MiB of wheels and, once, a torch 2.11.0 venv (about 2.7 GB where no CPU build of it is
reachable): ``heavy`` (nox -s heavy), never in nox -s tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.heavy
def test_prepare_then_rehearse_runs_green(tmp_path):
    folder = REPO / ".nox" / "device-test"  # inside the repo, and ignored (.nox/), as --prepare requires
    prepared = subprocess.run(
        [sys.executable, "-m", "fsdp_matrix", "device", "--prepare", str(folder)],
        cwd=REPO, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    assert prepared.returncode == 0, prepared.stderr
    assert "(limit 64.0 MiB)" in prepared.stdout
    out = tmp_path / "out"
    # this interpreter has the harness: run.sh builds its rehearsal venv with it (else it looks for nox -s device's env,
    # which a fresh clone's nox -s heavy never built: "no Python with the harness", 2026-11-29)
    env = {**os.environ, "FSDP_MATRIX_HOST_PYTHON": sys.executable}
    done = subprocess.run(["bash", str(folder / "run.sh"), "--rehearse", "--out", str(out)], capture_output=True,
                          text=True, timeout=3600, env=env)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert len(list(out.iterdir())) <= 8
    env = json.loads((out / "env.json").read_text())
    for site, seen in env["sites"].items():
        assert not any("import failed" in str(v) for v in seen.values()), (site, seen)
    facts = json.loads((out / "platform-facts.json").read_text())
    assert [p["ok"] for p in facts["parts"] if p["part"].startswith("gloo")] == [True, True]
    records = [json.loads(line) for f in out.glob("cells-*.jsonl") for line in f.read_text().splitlines()]
    smoke = [r for r in records if r["case"] == "lora-requires-grad"]
    assert len(smoke) >= 2 and not any(r["verdict"] in ("env-error", "crash", "hang") for r in records)
