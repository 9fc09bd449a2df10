from __future__ import annotations

import pytest
import torch

from fsdp_matrix.workload.tinynets import build_tinynet
from tests.workload.support import cpu_context


@pytest.mark.parametrize("shape", ["plain", "hf_none"])
def test_tinynet_has_no_split_modules_and_a_loss(tmp_path, shape):
    model = build_tinynet(shape, cpu_context(tmp_path))
    assert getattr(model, "_no_split_modules", None) in (None, set())
    assert not any(getattr(m, "_no_split_modules", None) for m in model.modules())
    ids = torch.zeros(2, 4, dtype=torch.long)
    out = model(input_ids=ids, labels=ids)
    # FSDP1 only hooks the root's backward on tensors it finds in the output: it must be a dict-like ModelOutput
    assert isinstance(out, dict) and torch.isfinite(out.loss)


def test_unknown_shape(tmp_path):
    with pytest.raises(ValueError, match="unknown shape"):
        build_tinynet("cube", cpu_context(tmp_path))
