"""The ranks' environment (protocol.launch_environ): the caller's variables that steer what a cell exercises never
reach a rank, and the record lists them; the machine's own settings pass through."""

from __future__ import annotations

import os
import sys
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

from fsdp_matrix.runner import launch as launch_module
from fsdp_matrix.runner.launcher import Launcher
from fsdp_matrix.runner.protocol import (
    KEPT_ENV,
    STRIPPED_ENV_NAMES,
    STRIPPED_ENV_PREFIXES,
    launch_environ,
    stripped,
)

EXERCISE = {
    "TORCH_COMPILE_DISABLE": "1",
    "TORCHDYNAMO_DISABLE": "1",
    "TORCHDYNAMO_INLINE_INBUILT_NN_MODULES": "0",
    "TORCHINDUCTOR_FREEZING": "1",
    "CUDA_LAUNCH_BLOCKING": "1",
    "TORCH_DISTRIBUTED_DEBUG": "DETAIL",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "0",
    "NCCL_BLOCKING_WAIT": "1",
}
"""What a caller's shell may hold that changes what a cell exercises (reliability review 2026-11-28, defect 4:
``TORCH_COMPILE_DISABLE=1`` turned every compile cell into a pass in 1.3 s instead of 10.9 s, nothing compiled)."""
MACHINE = {
    "PATH": "/usr/bin",
    "HF_HUB_OFFLINE": "1",
    "NCCL_SOCKET_IFNAME": "lo",
    "GLOO_SOCKET_IFNAME": "lo",
    "OMP_NUM_THREADS": "1",
    "FSDP_MATRIX_TORCH_CPU_INDEX": "x",
}
"""The machine's settings (interfaces, threads, offline mode) and the harness's own: they pass through."""


def test_variables_that_change_what_a_cell_exercises_are_stripped_and_listed():
    env, removed = launch_environ({**EXERCISE, **MACHINE, "ACCELERATE_USE_FSDP": "true"})
    assert removed == sorted([*EXERCISE, "ACCELERATE_USE_FSDP"])
    assert env == MACHINE


# ---- property: any caller environment -----------------------------------------------------------------------------

_SUFFIX = st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_", max_size=12)
_STEERING = st.one_of(
    st.builds(lambda p, s: p + s, st.sampled_from(STRIPPED_ENV_PREFIXES), _SUFFIX),
    st.sampled_from(STRIPPED_ENV_NAMES),
).filter(lambda name: not name.startswith("FSDP_MATRIX_"))  # FSDP_ + MATRIX_...: the harness's own, kept
"""Names of variables that change what a cell exercises, as a caller's shell may hold them."""
_OTHER = st.one_of(
    st.sampled_from(["PATH", "HOME", "NCCL_SOCKET_IFNAME", "NCCL_IB_DISABLE", "GLOO_SOCKET_IFNAME", "HF_HUB_OFFLINE"]),
    st.builds(lambda s: "FSDP_MATRIX_" + s, _SUFFIX),
    st.sampled_from(KEPT_ENV),
    st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZ_", min_size=1, max_size=16),
)
_VALUES = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=8)


@settings(max_examples=200, deadline=None)
@given(steering=st.dictionaries(_STEERING, _VALUES, max_size=8), other=st.dictionaries(_OTHER, _VALUES, max_size=8))
def test_every_steering_variable_is_stripped_and_listed_and_none_leaks_to_a_rank(steering, other, tmp_path_factory):
    base = {**other, **steering}
    env, removed = launch_environ(base)
    should_go = sorted(set(steering) | {k for k in other if stripped(k)})
    assert removed == should_go  # listed in the record's env_removed, each once
    assert not any(stripped(k) for k in env) and not set(env) & set(steering)
    assert env == {k: v for k, v in base.items() if k not in removed}  # everything else passes unchanged
    # what the launcher hands torchrun (its own settings added): none of the caller's steering variables either
    launcher = Launcher(run_root=tmp_path_factory.getbasetemp() / "launches", python=sys.executable)
    with mock.patch.dict(os.environ, base, clear=True):
        ranks_env, listed = launch_module._environ(launcher, "launch-id")  # the Launch builds it from its spec
    assert listed == removed and not any(stripped(k) for k in ranks_env)
