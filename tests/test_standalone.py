"""A repro run alone under torchrun: it leaves nothing behind in the temp folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
FAULTS = HERE / "runner"


def test_standalone_run_removes_its_scratch_folder(tmp_path):
    """``/tmp/fsdp-matrix-<run id>`` (where rank 0 may save a tiny model for the others) was never
    removed."""
    script = tmp_path / "solo.py"
    script.write_text(
        "import sys\n"
        # this checkout's fsdp_matrix, whichever one is installed
        f"sys.path[:0] = [{str(HERE.parent)!r}, {str(FAULTS)!r}]\n"
        "from fault_cells import run\n"
        "from fsdp_matrix.standalone import main\n"
        "if __name__ == '__main__':\n"
        "    sys.exit(main(run, 'faults'))\n"
    )
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script)]
    cmd += ["--matrix", str(FAULTS / "fault_matrix.yaml"), "--device", "cpu", "--no-record", "--fault", "ok"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "fix-holds: faults/fault_ok-ws2" in proc.stdout, proc.stdout + proc.stderr
    assert not list(tmp.glob("fsdp-matrix-*")), "the scratch folder was left behind"


def _solo(tmp_path: Path, body: str, case: str, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """Run a repro of ``body`` (its run()) alone under torchrun on 2 ranks, against tests/runner's fault matrix."""
    script = tmp_path / "solo.py"
    script.write_text(
        "import sys\n"
        f"sys.path[:0] = [{str(HERE.parent)!r}]\n"
        "import torch\nimport torch.distributed as dist\n"
        "from fsdp_matrix.case import main\n" + body + "\nif __name__ == '__main__':\n"
        f"    sys.exit(main(run, {case!r}))\n"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script)]
    cmd += ["--matrix", str(FAULTS / "fault_matrix.yaml"), "--device", "cpu", "--no-record", *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def test_a_repro_runs_alone_before_its_case_is_in_matrix_yaml(tmp_path):
    """README step 1 before step 2: the run ended in UnknownCellError and the outcome was lost."""
    body = "def run(params, ctx):\n    t = torch.ones(2)\n    dist.all_reduce(t)\n    return {'sum': float(t.sum())}\n"
    proc = _solo(tmp_path, body, "my-bug", "--adapter", "lora")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "case my-bug is not in matrix.yaml yet" in proc.stderr
    assert "my-bug/lora-ws2: observed ok" in proc.stdout, proc.stdout + proc.stderr


def test_a_misaligned_collective_prints_the_ranks_exception_and_ends(tmp_path):
    """Rank 0 raised before a collective rank 1 entered: the run waited the process-group timeout in main's own
    all_gather_object and never printed rank 0's exception."""
    body = (
        "def run(params, ctx):\n"
        "    if ctx.rank == 0:\n        raise ValueError('rank 0 left before the collective')\n"
        "    dist.all_reduce(torch.ones(2))\n    return {}\n"
    )
    proc = _solo(tmp_path, body, "my-bug", "--adapter", "lora", "--timeout", "120", "--gather-timeout", "5")
    assert "rank 0: Traceback" in proc.stderr and "rank 0 left before the collective" in proc.stderr, proc.stderr
    assert "my-bug/lora-ws2: observed ValueError: rank 0 left" in proc.stdout, proc.stdout + proc.stderr
    assert proc.returncode != 0  # rank 1, still in its collective, is stopped by torchrun when rank 0 ends the run
