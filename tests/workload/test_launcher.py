"""``accelerate_launch_env``: the variables a real ``accelerate launch --config_file <fsdp yaml>`` gives its ranks,
only inside the block."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import yaml

from fsdp_matrix.workload.launcher import accelerate_launch_env, fsdp_launch_config, launch_env

PREFIXES = ("ACCELERATE_", "FSDP_")
DUMP = "import json, os; print('ENV=' + json.dumps({k: v for k, v in os.environ.items() if k.startswith(%r)}))"


def _config(world_size: int = 2) -> dict:
    return fsdp_launch_config("LlamaDecoderLayer", version=1, orig=True, world_size=world_size)


def test_the_block_sees_the_launch_variables_and_they_are_restored_after(monkeypatch):
    monkeypatch.setenv("FSDP_USE_ORIG_PARAMS", "false")  # a caller's own value comes back
    monkeypatch.delenv("ACCELERATE_USE_FSDP", raising=False)
    with accelerate_launch_env(_config()) as exported:
        assert os.environ["ACCELERATE_USE_FSDP"] == "true"
        assert os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] == "true"
        assert os.environ["FSDP_USE_ORIG_PARAMS"] == "true"
        assert exported["FSDP_TRANSFORMER_CLS_TO_WRAP"] == "LlamaDecoderLayer"
    assert "ACCELERATE_USE_FSDP" not in os.environ
    assert os.environ["FSDP_USE_ORIG_PARAMS"] == "false"


def test_the_variables_are_those_of_a_real_accelerate_launch(tmp_path, monkeypatch):
    for key in [k for k in os.environ if k.startswith(PREFIXES)]:
        monkeypatch.delenv(key)
    config = _config(world_size=1)
    path = tmp_path / "fsdp.yaml"
    path.write_text(yaml.safe_dump(config))
    script = tmp_path / "dump.py"
    script.write_text(DUMP % (PREFIXES,))
    env = dict(os.environ)
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(path), str(script)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    launched = json.loads(next(line[4:] for line in out.stdout.splitlines() if line.startswith("ENV=")))
    with_clean_env = {k: v for k, v in launch_env(config).items() if k.startswith(PREFIXES)}
    assert launched == with_clean_env
