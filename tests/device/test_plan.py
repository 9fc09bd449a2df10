"""The device plan: which cells, in which order, packed into calls that fit."""

from __future__ import annotations

import pytest

from fsdp_matrix.cells import find_cell
from fsdp_matrix.device import image, plan
from fsdp_matrix.matrix import load_matrix

MATRIX = load_matrix()


@pytest.fixture(scope="module")
def built():
    return plan.build_steps(MATRIX)


def test_seed_002_runs_first_on_peft_0_13_0_then_on_a_fixed_release(built):
    steps, _ = built
    names = [s.name for s in steps]
    assert names[:3] == ["merge-peft0.13.0", "merge-fixed", "cuda-cells"] and "probe" in names
    old, fixed = steps[0], steps[1]
    assert old.site == image.OLD.name and old.cells and all(c.startswith("merge-device/") for c in old.cells)
    assert fixed.site == image.BASE.name and fixed.cells == old.cells


def test_every_cell_the_device_changes_is_planned_at_world_size_1(built):
    steps, _ = built
    planned = {c for s in steps if s.name not in ("cpu-sample", "cuda-ws2-shared") for c in s.cells}
    # the cases whose rules name the device or that need cuda, under the image's versions
    for key in ("fsdp2-4bit-forward/qlora-bf16-fsdp2-llama-storage_bf16-ws1",
                "trl-dpo-precompute-fsdp2/lora-fp32-fsdp2-llama-entry_trl-precompute1-ws1",
                "qdora-cpu-init/qdora-fsdp2-llama-quantized_on_cuda-storage_uint8-ws1"):  # fmt: skip
        assert key in planned
    assert all(c.endswith("-ws1") for c in planned)
    # no TRL cell on the old site: base's trl under it wants a newer transformers
    old = next(s for s in steps if s.name == "cuda-cells-old")
    assert old.cells and not any("entry_trl" in c for c in old.cells)
    # a cell the device does not change is not in the device steps (it may be in the sample)
    assert "lora-requires-grad/lora-fp32-orig1-decoder_layer-llama-ws1" not in planned


def test_the_sample_takes_one_cell_of_each_other_case(built):
    steps, _ = built
    sample = next(s for s in steps if s.name == "cpu-sample")
    cases = [c.split("/")[0] for c in sample.cells]
    taken = {c.split("/")[0] for s in steps if s.name not in ("cpu-sample", "cuda-ws2-shared") for c in s.cells}
    assert len(cases) == len(set(cases)) and not set(cases) & taken
    for key in sample.cells:
        assert find_cell(MATRIX, key, "cuda").world_size == 1


def test_cells_no_world_size_1_run_reaches_need_2_gpus(built):
    _, two = built
    assert "adapter-save-sharded/lora-orig1-root_only-llama-ws2" in two  # min_world_size: 2
    assert any(c.startswith("uneven-shards/") and c.endswith("-ws4") for c in two)  # a pinned layout
    assert not any(c.startswith("merge-device/") for c in two)


def _steps(*specs):
    return [plan.Step(name, "cells", site, "", ("c/x-ws1",), est) for name, site, est in specs]


STACKS = {"harness": ("harness",), "big": ("big", "harness"), "old": ("old", "harness")}


def test_pack_puts_steps_first_fit_in_order_of_value():
    steps = _steps(("a", "old", 100), ("b", "big", 100), ("c", "old", 100), ("d", "big", 50))
    sizes = {"harness": 2, "big": 40, "old": 15}
    calls = plan.pack(steps, sizes, fixed_bytes=3, limit=59, budget_s=480, stack=STACKS.get)
    assert [c.steps for c in calls] == [("a", "c"), ("b", "d")]
    assert calls[0].sites == ("harness", "old") and calls[0].bytes == 20
    one = plan.pack(steps, sizes, fixed_bytes=3, limit=64, budget_s=480, stack=STACKS.get)
    assert [c.steps for c in one] == [("a", "b", "c", "d")] and one[0].bytes == 60
    timed = plan.pack(steps, sizes, fixed_bytes=3, limit=64, budget_s=250, stack=STACKS.get)
    assert [c.steps for c in timed] == [("a", "b", "d"), ("c",)]  # d still fits the first call's time


def test_pack_refuses_a_step_that_cannot_fit_alone():
    with pytest.raises(ValueError, match="step b needs 45 bytes"):
        plan.pack(_steps(("a", "harness", 1), ("b", "big", 1)), {"harness": 2, "big": 40}, 3, 44, stack=STACKS.get)


def test_a_plan_reads_back_and_another_schema_is_refused(built):
    steps, two = built
    calls = plan.pack(steps, {"harness": 1, "base": 1, "peft0.13.0": 1}, 1, 1 << 30)
    written = plan.Plan(steps, calls, two, versions={"base": {"peft": "0.21.1"}})
    again = plan.load(written.to_json())
    assert again == written
    with pytest.raises(ValueError, match="not a schema-1 plan"):
        plan.load('{"schema": 0}')
    with pytest.raises(ValueError, match="does not parse"):
        plan.load("{")


def test_the_shared_step_runs_two_ranks_on_one_gpu(built):
    steps, two = built
    shared = steps[-1]
    assert (shared.name, shared.world_size, shared.share_gpu) == ("cuda-ws2-shared", 2, True)
    assert shared.cells and all(c.endswith("-ws2") for c in shared.cells)
    # the device cells at world size 2 first (the reports' layout), then the 2-rank cells, then the sample
    ones = {c for s in steps if s.name in ("cuda-cells", "cpu-sample") for c in s.cells}
    device = next(s for s in steps if s.name == "cuda-cells")
    assert shared.cells[0][: -len("-ws2")] + "-ws1" in device.cells
    assert "fsdp2-4bit-forward/qlora-bf16-fsdp2-llama-storage_bf16-ws2" in shared.cells
    assert {c[: -len("-ws2")] + "-ws1" for c in shared.cells if c not in two} <= ones
    assert not any("entry_trainer" in c or "save_trainer" in c for c in shared.cells)
