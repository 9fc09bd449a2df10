from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from fsdp_matrix.errors import CheckFailed
from fsdp_matrix.workload.adapters import add_adapter
from fsdp_matrix.workload.checks import Failures
from fsdp_matrix.workload.models import build_model
from fsdp_matrix.workload.recipe import wrap_and_train
from tests.workload.support import cpu_context, one_rank_group, rank_outcomes, run_two_ranks


@pytest.fixture(scope="module")
def ctx(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("checks")
    one_rank_group(tmp)
    return cpu_context(tmp)


def test_failures_raise_every_message_joined():
    failed = Failures()
    failed.raise_if_any()  # none collected: nothing raised
    failed.append("loss not finite")
    failed.append("2/4 trainable tensors unchanged")
    with pytest.raises(CheckFailed, match=r"^loss not finite; 2/4 trainable tensors unchanged$"):
        failed.raise_if_any()


def test_a_cell_promised_two_ranks_that_trains_alone_in_a_one_rank_world_fails(ctx):
    """Reliability review 2026-11-28, defect 3: a library bug that re-initialises the process group (or a launcher
    variable lost on the way) leaves each rank training alone in a 1-rank world. FSDP1 falls back to NO_SHARD,
    nothing is sharded, 0 all-gathers and 0 reduce-scatters happen, and "ranks agree" holds trivially: every check
    passed (fix-holds). Here the pytest process's own 1-rank group stands for that world, and the cell's context
    promises the 2 ranks its id names."""
    promised = replace(ctx, world_size=2)
    model = add_adapter(build_model("llama", "fp32", ctx), "lora", seed=0)
    params = {"adapter": "lora", "dtype": "fp32", "wrap": "decoder_layer", "orig": 1, "model": "llama"}
    with pytest.raises(CheckFailed) as failed:
        wrap_and_train(model, params, promised)
    message = str(failed.value)
    assert "world: the process group had 1 rank before training and 1 after, the cell was promised 2" in message
    assert "sharding: FSDP spreads the parameters over 1 of the cell's 2 ranks" in message
    assert "reduce-scattered 0 times in 3 optimizer steps" in message


@pytest.mark.timeout(600)
def test_two_ranks_that_each_train_alone_in_a_world_of_their_own_fail(tmp_path):
    """The same on 2 real ranks, as the review ran it: each destroys the launch's group and re-initialises a 1-rank
    world, then wrap_and_train (scratch_world.py). On 771cdf4 both ranks passed every check."""
    proc = run_two_ranks(Path(__file__).with_name("scratch_world.py"), str(tmp_path))
    for got in rank_outcomes(proc, tmp_path):
        assert got["status"] == "CheckFailed", got
        assert (
            "world: the process group had 1 rank before training and 1 after, the cell was promised 2"
            in (got["message"])
        )
