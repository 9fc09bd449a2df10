"""The training loop of the hand-written upstream scripts (repros/upstream/), inlined into their exports."""

from __future__ import annotations

import torch
from torch import nn


def train(model: nn.Module, device: torch.device, steps: int = 3) -> dict:
    """``steps`` AdamW steps on a fixed batch of token ids (labels = inputs). A fix holds only if training works:
    every loss is finite and some trainable tensor changed, else AssertionError."""
    batch = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0)).to(device)
    trainable = [p for p in model.parameters() if p.requires_grad]
    before = [p.detach().clone() for p in trainable]
    optimizer = torch.optim.AdamW(trainable, lr=1e-2)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    changed = sum(not torch.equal(a, p.detach()) for a, p in zip(before, trainable))
    if not all(torch.isfinite(torch.tensor(losses))) or not changed:
        raise AssertionError(f"training did not work: losses {losses}, {changed} trainable tensors changed")
    return {"losses": losses, "changed": changed}
