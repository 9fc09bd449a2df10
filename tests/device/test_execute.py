"""What run.sh runs: which steps, under which sites, and the files it leaves in --out."""

from __future__ import annotations

import argparse
import json

import pytest

from fsdp_matrix.device import execute, plan

STEPS = [
    plan.Step("merge-peft0.13.0", "cells", "peft0.13.0", "seed 002", ("merge-device/lora-fp32-llama-ws1",)),
    plan.Step("probe", "probe", "harness", "two ranks"),
    plan.Step("cpu-sample", "cells", "base", "sample", ("a/x-ws1",)),
]
PLAN = plan.Plan(
    STEPS,
    [plan.Call(1, ("harness", "base", "peft0.13.0"), ("merge-peft0.13.0", "probe")), plan.Call(2, ("harness",), ())],
    smoke={"base": "lora-requires-grad/x-ws1", "peft0.13.0": "lora-requires-grad/x-ws1"},
)


def test_a_call_its_steps_any_step_by_name_and_every_step_for_the_rehearsal():
    assert [s.name for s in execute.chosen_steps(PLAN, 1, "")] == ["merge-peft0.13.0", "probe"]
    assert [s.name for s in execute.chosen_steps(PLAN, 1, "cpu-sample")] == ["cpu-sample"]
    assert execute.chosen_steps(PLAN, 0, "") == STEPS
    with pytest.raises(ValueError, match="the plan has calls 1..2"):
        execute.chosen_steps(PLAN, 3, "")
    with pytest.raises(ValueError, match="no step nope"):
        execute.chosen_steps(PLAN, 1, "probe,nope")


def test_the_rehearsal_adds_one_cpu_cell_per_site_it_uses():
    steps = execute.with_smoke(PLAN, execute.chosen_steps(PLAN, 1, ""))
    assert [s.name for s in steps] == ["merge-peft0.13.0", "probe", "smoke-peft0.13.0"]
    assert steps[-1].cells == ("lora-requires-grad/x-ws1",) and steps[-1].site == "peft0.13.0"


def test_a_step_runs_under_its_site_stack_and_files_records_by_site(tmp_path):
    # the old versions in front of base's bitsandbytes (every cell imports it), then the harness's pydantic
    assert execute.site_path(tmp_path, "peft0.13.0").split(":") == [
        str(tmp_path / "sites" / s) for s in ("peft0.13.0", "base", "harness")
    ]
    assert execute.combo_for(PLAN, STEPS[0], "cuda") == "gpu-image-peft0.13.0"
    assert execute.combo_for(PLAN, STEPS[2], "cuda") == "gpu-image"
    assert execute.combo_for(PLAN, STEPS[2], "cpu") == "gpu-image-rehearsal"
    args = argparse.Namespace(device="cuda", work=tmp_path)
    argv = execute.step_argv(PLAN, STEPS[0], args, list(STEPS[0].cells))
    assert argv[1:] == ["-m", "fsdp_matrix", "run", "--device", "cuda", "--world-size", "1", "--combo",
                        "gpu-image-peft0.13.0", "--results", str(tmp_path / "results" / "gpu-image-peft0.13.0"),
                        "--cell-timeout", "120", "merge-device/lora-fp32-llama-ws1"]  # fmt: skip


def test_the_site_check_reads_its_own_line_after_what_imports_print():
    assert execute._last_json('bitsandbytes says hello\n{"torch": "2.11.0"}\n') == {"torch": "2.11.0"}
    assert execute._last_json("Traceback ...\nImportError: x") is None


def test_collect_leaves_at_most_8_files_in_out(tmp_path):
    work, out = tmp_path / "work", tmp_path / "out"
    out.mkdir()
    for combo in ("gpu-image", "gpu-image-peft0.13.0"):
        launch = work / "results" / combo / "launches" / "cli" / "l1"
        launch.mkdir(parents=True)
        (work / "results" / combo / "cells.jsonl").write_text('{"key": 1}\n')
        (launch / "rank0.log").write_text("log\n" * 100)
    (work / "platform-facts.json").write_text("{}")
    (out / "run.log").write_text("x")
    (out / "env.json").write_text("{}")
    (out / "report.md").write_text("r")
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(PLAN.to_json())
    written = execute.collect(work, out, plan_path)
    names = sorted(p.name for p in out.iterdir())
    assert names == ["cells-gpu-image-peft0.13.0.jsonl", "cells-gpu-image.jsonl", "env.json", "launches.tar.gz",
                     "plan.json", "platform-facts.json", "report.md", "run.log"]  # fmt: skip
    assert len(written) == 8 and json.loads((out / "plan.json").read_text())["schema"] == 1
