"""The ``init`` axis of workload/meta_init.py: rank 0 loads, rank 1 builds on meta, the weights arrive through FSDP,
and the checks' reference comes from rank 0's real weights (for real on 2 ranks: ``meta_init_outcomes``); the CPU
shims it needs, on one process."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fsdp_matrix.workload import cpu_shim, meta_init
from fsdp_matrix.workload.params import UnknownAxisValue
from tests.workload.support import rank_outcomes, run_two_ranks


@pytest.fixture(scope="module")
def meta_init_outcomes(tmp_path_factory):
    out = tmp_path_factory.mktemp("meta-init")
    proc = run_two_ranks(Path(__file__).with_name("scratch_meta_init.py"), str(out))
    return rank_outcomes(proc, out)


def test_init_defaults_to_full_and_refuses_an_unknown_value():
    assert meta_init.init_of({}) == "full"
    assert meta_init.ram_efficient({"init": "ram_efficient"})
    with pytest.raises(UnknownAxisValue, match="axis 'init': unknown value 'lazy'"):
        meta_init.init_of({"init": "lazy"})


@pytest.mark.timeout(600)
def test_only_rank_0_holds_real_weights(meta_init_outcomes):
    rank0, rank1 = (o["built"]["checks"] for o in meta_init_outcomes)
    assert rank0["meta"] == 0
    assert rank1["meta"] == rank1["params"] > 0


@pytest.mark.timeout(600)
def test_the_reference_of_every_rank_is_rank_0s(meta_init_outcomes):
    rank0, rank1 = (o["references"]["checks"] for o in meta_init_outcomes)
    # taken on rank 1's own model it would be a meta forward: that reference is what the broadcast replaces
    assert rank0["local_error"] is None and rank1["local_error"] is not None
    assert rank0["shared_error"] is rank1["shared_error"] is None
    assert rank0["shared_logits_sum"] == rank1["shared_logits_sum"]
    assert rank0["shared_params"] == rank1["shared_params"] == 29


@pytest.mark.timeout(600)
@pytest.mark.parametrize("scenario", ["fsdp1", "fsdp2"])
def test_ram_efficient_weights_train_and_match_the_unwrapped_model(meta_init_outcomes, scenario):
    for outcome in meta_init_outcomes:
        got = outcome[scenario]
        assert got["status"] == "ok", got
        checks = got["checks"]
        # the forward equals rank 0's unwrapped model: rank 1's meta tensors got rank 0's values
        assert checks["forward_max_diff"] == 0.0 and checks["trainable_changed"] == checks["trainable_tensors"] == 8


def test_the_sync_check_is_lifted_on_cpu_only_and_restored():
    from torch.distributed.fsdp import _init_utils

    original = _init_utils._check_module_states_for_sync_module_states
    cpu_state = [torch.zeros(1)]
    with pytest.raises(ValueError, match="CPU parameters or buffers when `sync_module_states=True`"):
        original(cpu_state)
    with meta_init.cpu_sync_module_states(torch.device("cpu")) as lines:
        assert lines == [meta_init.SYNC_SHIM]
        _init_utils._check_module_states_for_sync_module_states(cpu_state)  # lifted: no error
    assert _init_utils._check_module_states_for_sync_module_states is original
    with meta_init.cpu_sync_module_states(torch.device("cuda", 0)) as lines:
        assert lines == [] and _init_utils._check_module_states_for_sync_module_states is original


class _Plugin:
    """Stands in for FullyShardedDataParallelPlugin: its __post_init__ raises what accelerate raises on CPU."""

    def __init__(self, sync: bool, message: str) -> None:
        self.sync_module_states, self.param_init_fn, self.message = sync, None, message

    def __post_init__(self) -> None:
        raise RuntimeError(self.message)


def test_shim_e_turns_only_the_no_device_error_into_a_cpu_param_init_fn():
    record = cpu_shim.ShimRecord(active=True)
    post_init = cpu_shim._cpu_post_init(_Plugin.__post_init__, record)
    plugin = _Plugin(True, cpu_shim.NO_DEVICE + ", must be one of 'XPU', 'CUDA'")
    post_init(plugin)
    module = torch.nn.Linear(2, 2, device="meta")
    plugin.param_init_fn(module)
    assert module.weight.device.type == "cpu" and record.applied[0].startswith("(E)")
    for other in (_Plugin(True, "something else"), _Plugin(False, cpu_shim.NO_DEVICE)):
        with pytest.raises(RuntimeError):
            post_init(other)
