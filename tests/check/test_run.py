"""``check --run``: the cells a config matches run here through the runner, and no other cell does."""

from __future__ import annotations

import json
from pathlib import Path

from fsdp_matrix import cli

HERE = Path(__file__).resolve().parent
MATRIX = HERE / "toy_matrix.yaml"
FSDP1_ORIG0 = """\
distributed_type: FSDP
num_processes: 2
fsdp_config:
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_use_orig_params: false
  fsdp_sharding_strategy: FULL_SHARD
"""


def test_run_runs_only_the_matching_cells(tmp_path, capsys):
    config = tmp_path / "accelerate.yaml"
    config.write_text(FSDP1_ORIG0)
    results = tmp_path / "results"
    argv = [
        "check",
        "--accelerate-config",
        str(config),
        "--matrix",
        str(MATRIX),
        "--run",
        "--run-results",
        str(results),
    ]
    status = cli.main(argv)
    out = capsys.readouterr().out
    assert status == 0, out
    records = [json.loads(line) for line in (results / "cells.jsonl").read_text().splitlines()]
    # the toy case has three cells (orig 0 and 1 on decoder_layer, and fsdp2): the config is FSDP1, orig 0
    assert [(r["case"], r["cell"]) for r in records] == [("toy", "lora-orig0-decoder_layer-ws2")]
    assert records[0]["verdict"] == "fix-holds"
    assert "check --run: 1 matching cell(s)" in out
    assert "fix-holds" in out and "toy/lora-orig0-decoder_layer-ws2" in out

    # the records it wrote are the evidence of the next answer: observed on these versions
    assert cli.main(["check", "--accelerate-config", str(config), "--matrix", str(MATRIX), "--results", str(results),
                     "--json"]) == 0  # fmt: skip
    (toy,) = json.loads(capsys.readouterr().out)["cases"]
    (rule,) = toy["expectations"]
    assert (toy["status"], rule["evidence"]) == ("trains", "observed")
    assert rule["evidence_line"] == "observed on your versions (run here): fix-holds 1 of 1 cell(s)"
