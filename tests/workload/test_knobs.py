"""The knobs of workload/knobs.py as a cell runs them: a compile cell must have compiled something to pass."""

from __future__ import annotations

import pytest
import torch

from fsdp_matrix.errors import CheckFailed
from fsdp_matrix.workload.adapters import add_adapter
from fsdp_matrix.workload.checks import trainable_names
from fsdp_matrix.workload.knobs import CompileProbe, Knobs, compiled_frames, torch_compile
from fsdp_matrix.workload.models import build_model
from fsdp_matrix.workload.training import train_and_check
from fsdp_matrix.workload.wrapping import wrap
from tests.workload.support import cpu_context, one_rank_group

PARAMS = {"adapter": "lora", "wrap": "fsdp2", "model": "llama", "compile": "whole"}


@pytest.fixture(scope="module")
def ctx(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("knobs")
    one_rank_group(tmp)
    return cpu_context(tmp)


def _compiled(ctx):
    model = add_adapter(build_model("llama", "fp32", ctx), "lora", seed=0)
    names = trainable_names(model)
    wrapped = wrap(model, "fsdp2", None, ctx)
    torch_compile(wrapped, "whole", ctx.device)
    return wrapped, names


def test_a_compile_cell_where_nothing_was_compiled_fails(ctx):
    """Reliability review 2026-11-28, defect 4: with dynamo disabled (what ``TORCH_COMPILE_DISABLE=1`` and
    ``TORCHDYNAMO_DISABLE=1`` set, or a library that turns it off) every compile cell passed, nothing compiled."""
    # dynamo's own patch: pytest's monkeypatch deletes the attribute on undo, which hides a config entry for good
    with torch._dynamo.config.patch(disable=True):
        wrapped, names = _compiled(ctx)
        with pytest.raises(CheckFailed, match=r"compile: the cell asked compile whole and dynamo compiled 0 frames"):
            train_and_check(wrapped, ctx, trainable=names, params=PARAMS)


def test_a_compile_cell_that_compiled_passes_and_says_how_much(ctx):
    wrapped, names = _compiled(ctx)
    checks = train_and_check(wrapped, ctx, trainable=names, params=PARAMS)
    assert checks["compiled_frames"] > 0


def test_a_cell_without_compile_is_not_judged_on_it():
    probe = CompileProbe.start(Knobs())
    assert probe.judge() == ({}, [])
    assert compiled_frames() is not None  # torch 2.4 .. 2.13 count frames in torch._dynamo.utils.counters
