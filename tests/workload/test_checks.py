from __future__ import annotations

import pytest

from fsdp_matrix.errors import CheckFailed
from fsdp_matrix.workload.checks import Failures


def test_failures_raise_every_message_joined():
    failed = Failures()
    failed.raise_if_any()  # none collected: nothing raised
    failed.append("loss not finite")
    failed.append("2/4 trainable tensors unchanged")
    with pytest.raises(CheckFailed, match=r"^loss not finite; 2/4 trainable tensors unchanged$"):
        failed.raise_if_any()
