"""The ranks' environment (protocol.launch_environ): the caller's variables that steer what a cell exercises never
reach a rank, and the record lists them; the machine's own settings pass through."""

from __future__ import annotations

from fsdp_matrix.runner.protocol import launch_environ

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
