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
