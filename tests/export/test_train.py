"""Tests for fsdp_matrix.export.train: the upstream scripts' training loop, and when it says training failed."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from fsdp_matrix.export.train import train  # noqa: E402


class TinyLM(nn.Module):
    def __init__(self, broken: bool = False) -> None:
        super().__init__()
        self.embed, self.head = nn.Embedding(128, 8), nn.Linear(8, 128)
        self.embed.weight.requires_grad_(False)
        self.broken = broken

    def forward(self, input_ids, labels):
        logits = self.head(self.embed(input_ids))
        loss = nn.functional.cross_entropy(logits.reshape(-1, 128), labels.reshape(-1))
        return type("Out", (), {"loss": loss * float("nan") if self.broken else loss})


def test_a_working_model_trains_and_says_what_changed():
    model = TinyLM()
    frozen = model.embed.weight.detach().clone()
    out = train(model, torch.device("cpu"))
    assert len(out["losses"]) == 3 and out["changed"] == 2
    assert torch.equal(model.embed.weight, frozen)


def test_a_non_finite_loss_is_a_failure():
    with pytest.raises(AssertionError, match="training did not work: losses \\[nan"):
        train(TinyLM(broken=True), torch.device("cpu"))
