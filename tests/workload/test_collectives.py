"""The collectives check of workload/collectives.py: each broken pattern is caught, for real on 2 ranks (root-only
sharding, a unit whose unshard never runs, a reduce-scatter on every micro-step), healthy accumulation under FSDP1
and FSDP2 passes with its counts; the judge on counts made up here; the spy restores torch.distributed."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from torch import distributed as dist
from torch import nn

from fsdp_matrix.workload.collectives import KINDS, OTHER, CollectiveSpy, Promise, judge_counts, per_step, promise_of
from tests.workload.support import failed_on_both_ranks, rank_outcomes, run_two_ranks


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    out = tmp_path_factory.mktemp("collectives")
    proc = run_two_ranks(Path(__file__).with_name("scratch_collectives.py"), str(out))
    return rank_outcomes(proc, out)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("scenario", ["fsdp2_accum2", "fsdp1_accum2"])
def test_healthy_accumulation_keeps_its_promise(outcomes, scenario):
    got = [o[scenario] for o in outcomes]
    assert [g["status"] for g in got] == ["ok", "ok"], got
    counted = got[0]["collectives"]
    assert counted["judged"] and counted["micro_steps"] == 2 and counted["units"] == 3
    # every step all-gathers each of the 3 units in each of its 2 forwards, and reduce-scatters each of the 2 units
    # holding LoRA weights (the decoder layers; the root holds frozen weights only) once
    for step in counted["per_step"]:
        assert step["all_gather"] >= 6 and step["reduce_scatter"] == 2, counted


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    ("scenario", "words"),
    [
        ("root_only", ["promised FSDP units missing", "layers.0"]),
        ("sync_every_micro_step", ["reduce-scattered 2 times over 2 micro-steps"]),
    ],
)
def test_each_broken_pattern_is_caught(outcomes, scenario, words):
    message = failed_on_both_ranks(outcomes, scenario)
    for word in words:
        assert word in message, message


@pytest.mark.timeout(600)
def test_hooks_that_never_fire_fail_the_cell(outcomes):
    """Layer 0's FSDP2 hooks stubbed out: its LoRA tensors get no gradient, so the value checks fail the cell. The
    unshard count alone is reported, not failed (collectives._unshard_judged says why)."""
    got = [o["hooks_bypassed"] for o in outcomes]
    assert [g["status"] for g in got] == ["CheckFailed", "CheckFailed"], got
    assert all("layers.0.self_attn" in g["message"] and "got no gradient" in g["message"] for g in got), got


def _units(*names_holds_trains):
    return {name: (nn.Linear(1, 1), holds, trains) for name, holds, trains in names_holds_trains}


def test_judge_names_the_unit_and_its_count():
    spy = CollectiveSpy()
    spy.current.update({("all_gather", "a"): 2, ("all_gather", "b"): 1, ("reduce_scatter", "a"): 2})
    spy.current.update({("reduce_scatter", "b"): 1})
    spy.current.update({("all_reduce", OTHER): 1})
    spy.step()
    units = _units(("a", True, True), ("b", True, True), ("frozen", True, False))
    found, failures = judge_counts(spy, units, Promise(["a", "b", "frozen"], sharded=True), micro_steps=2)
    assert found["per_step"] == [{"all_gather": 3, "reduce_scatter": 3, "all_reduce": 1}]
    assert failures == [
        "collectives: step 0 unit a reduce-scattered 2 times over 2 micro-steps (promised: once per optimizer step)",
    ]
    assert found["unshard_short"] == [
        "step 0 unit b all-gathered 1 times over 2 forwards (its pre-forward unshard never ran)"
    ]


def test_an_unsharded_run_reports_counts_and_judges_nothing():
    spy = CollectiveSpy()
    spy.step()
    found, failures = judge_counts(spy, _units(("a", True, True)), Promise(["a", "c"], sharded=False), 1)
    assert failures == [] and found["judged"] is False and per_step(spy) == [dict.fromkeys(KINDS, 0)]


def test_the_spy_counts_paused_nothing_and_restores_torch_distributed():
    before = {name: getattr(dist, name, None) for names in KINDS.values() for name in names}
    spy = CollectiveSpy()
    with spy.spying():
        assert dist.all_reduce is not before["all_reduce"]
        spy.record("all_reduce")  # as a wrapped call does
        with spy.paused():
            spy.record("all_reduce")
    assert {name: getattr(dist, name, None) for name in before} == before
    assert spy.current == Counter({("all_reduce", OTHER): 1})


def _steps(*counts):
    spy = CollectiveSpy()
    for step in counts:
        spy.current.update(step)
        spy.step()
    return spy


def test_a_trainable_unit_never_reduce_scattered_fails_where_the_promise_is_sharded():
    """Review 2026-11-28 defect 3: a step's counts of 0 were never judged (only > 1 was)."""
    spy = _steps({("all_gather", "a"): 1, ("reduce_scatter", "a"): 1}, {("all_gather", "a"): 1})
    units = _units(("a", True, True), ("b", True, True), ("frozen", True, False))
    _, failures = judge_counts(spy, units, Promise(["a", "b", "frozen"], sharded=True, world_size=2), 1)
    assert failures == [
        "collectives: unit b reduce-scattered 0 times in 2 optimizer steps (its trainable gradients were never sharded)"
    ]


def test_a_sharded_run_that_never_all_gathers_fails():
    spy = _steps({("reduce_scatter", "a"): 1})
    _, failures = judge_counts(spy, _units(("a", True, True)), Promise(["a"], sharded=True, world_size=2), 1)
    assert failures == ["collectives: 0 all-gathers in 1 optimizer steps (nothing was ever unsharded)"]


def test_zero_exchanges_are_allowed_by_the_promise_not_by_a_blanket_exception():
    spy = _steps({})
    units = _units(("a", True, True))
    # shard: none asked over 2 ranks (NO_SHARD all-reduces), and a world of 1: nothing is sharded, nothing judged
    for promise in (
        Promise(["a"], sharded=False, world_size=2, shard="none", strategies={"a": "NO_SHARD"}),
        Promise(["a"], sharded=False, world_size=1, strategies={"a": "NO_SHARD"}),
    ):
        assert judge_counts(spy, units, promise, 1)[1] == []
    # a unit of frozen weights only (LoRA added after fully_shard: the adapters are plain tensors) is not judged
    assert judge_counts(spy, _units(("a", True, False)), Promise(["a"], sharded=True, world_size=2), 1)[1] == []


@pytest.mark.parametrize(
    ("shard", "fails"), [("full", True), ("grad_op", True), ("hybrid", True), ("none", False), (None, False)]
)
def test_an_fsdp1_unit_on_no_shard_is_a_broken_promise_unless_the_cell_asked_for_it(shard, fails):
    # FSDP1 falls back to NO_SHARD on a 1-rank group; None: a caller that gave no params (taken as asked)
    promise = Promise(["<root>"], sharded=False, world_size=2, shard=shard, strategies={"<root>": "NO_SHARD"})
    _, failures = judge_counts(_steps({}), _units(("<root>", True, True)), promise, 1)
    expected = f"collectives: 1/1 FSDP1 units run NO_SHARD, the cell asked {shard} sharding over 2 ranks: ['<root>']"
    assert failures == ([expected] if fails else [])


def test_the_promise_without_params_follows_what_the_units_run():
    model = nn.Linear(1, 1)
    assert promise_of(model, None, 2, shard=None).sharded  # no FSDP1 unit says otherwise
    assert promise_of(model, None, 2, shard="none").sharded is False
    assert promise_of(model, None, 1, shard="full").sharded is False
