"""The CPU shim applies only on CPU, records what it applied, and leaves nothing behind."""

from __future__ import annotations

import os

import torch
import transformers.trainer
from torch.distributed.fsdp._flat_param import FlatParamHandle

from fsdp_matrix.workload.cpu_shim import DEVICE_ENV, CpuFsdpAccelerator, cpu_fsdp_shim


def test_fsdp1_trainer_cell_on_cpu_gets_a_b_c_and_everything_is_undone(monkeypatch):
    monkeypatch.delenv(DEVICE_ENV, raising=False)
    accelerator_cls, to_cpu = transformers.trainer.Accelerator, FlatParamHandle.to_cpu
    with cpu_fsdp_shim(torch.device("cpu"), 1, trainer=True) as shim:
        assert os.environ[DEVICE_ENV] == "cpu"
        assert transformers.trainer.Accelerator is CpuFsdpAccelerator
        assert FlatParamHandle.to_cpu is to_cpu  # (D) only for cells that save
        assert [line[:3] for line in shim.applied] == ["(A)", "(C)"]
    assert DEVICE_ENV not in os.environ
    assert transformers.trainer.Accelerator is accelerator_cls and FlatParamHandle.to_cpu is to_cpu


def test_saving_fsdp1_cell_gets_d_and_it_is_undone():
    to_cpu = FlatParamHandle.to_cpu
    with cpu_fsdp_shim(torch.device("cpu"), 1, saves=True) as shim:
        assert FlatParamHandle.to_cpu is not to_cpu
        assert any(line.startswith("(D)") for line in shim.applied)
    assert FlatParamHandle.to_cpu is to_cpu


def test_fsdp2_needs_no_device_variable(monkeypatch):
    monkeypatch.setenv(DEVICE_ENV, "keep-me")
    with cpu_fsdp_shim(torch.device("cpu"), 2) as shim:
        assert os.environ[DEVICE_ENV] == "keep-me" and shim.applied == []
    assert os.environ[DEVICE_ENV] == "keep-me"


def test_nothing_applies_on_gpu():
    accelerator_cls = transformers.trainer.Accelerator
    with cpu_fsdp_shim(torch.device("cuda", 0), 1, trainer=True, saves=True) as shim:
        assert not shim.active and shim.applied == []
        assert transformers.trainer.Accelerator is accelerator_cls and DEVICE_ENV not in os.environ
