"""check_same_tokens: the sharded and the unsharded generate compared, both recorded, CheckFailed when they differ."""

from __future__ import annotations

import pytest
import torch

from fsdp_matrix.errors import CheckFailed
from fsdp_matrix.workload.generation import check_same_tokens

PROMPT = torch.tensor([[5, 6, 7, 1, 2], [8, 9, 7, 3, 4]])  # 3 prompt tokens, then 2 new ones per row


def test_equal_tokens_are_recorded_and_pass():
    checks = check_same_tokens({"losses": [1.0]}, PROMPT, PROMPT.clone(), 3, "generate under FSDP2")
    assert checks == {
        "losses": [1.0],
        "new_tokens_row0": [1, 2],
        "unsharded_new_tokens_row0": [1, 2],
        "tokens_equal_unsharded": True,
    }


def test_other_tokens_fail_naming_both_and_keep_the_record():
    other = PROMPT.clone()
    other[1, 4] = 0
    checks: dict = {}
    with pytest.raises(CheckFailed) as raised:
        check_same_tokens(checks, PROMPT, other, 3, "generate under FSDP1 on rank 1")
    assert str(raised.value) == (
        "generate under FSDP1 on rank 1 gave [[1, 2], [3, 4]], the unsharded model [[1, 2], [3, 0]]"
    )
    assert checks["tokens_equal_unsharded"] is False


def test_a_shorter_generation_differs():
    with pytest.raises(CheckFailed, match="gave"):
        check_same_tokens({}, PROMPT[:, :4], PROMPT, 3, "generate")
