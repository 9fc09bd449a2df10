"""What the generate cases compare a sharded model's generate() with: the same model trained unsharded, and greedy
decoding that every rank can reproduce."""

from __future__ import annotations

import torch
from torch import nn

from fsdp_matrix.errors import CheckFailed
from fsdp_matrix.workload.training import LR

NEW_TOKENS = 8
"""Tokens generated after the prompt."""


def train_unsharded(model: nn.Module, batch: torch.Tensor, steps: int) -> None:
    """The steps ``train_and_check`` takes (AdamW at its learning rate, the same batch), on an unwrapped model: every
    rank's batch is the same, so FSDP's averaged gradient equals this one and the two models end up alike."""
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR)
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        model(input_ids=batch, labels=batch).loss.backward()
        optimizer.step()


def greedy_generate(model: nn.Module, prompt: torch.Tensor, new_tokens: int = NEW_TOKENS) -> torch.Tensor:
    """Greedy decoding with the KV cache, no early stop: the same tokens on every rank and for equal weights."""
    return model.generate(
        input_ids=prompt,
        attention_mask=torch.ones_like(prompt),
        max_new_tokens=new_tokens,
        do_sample=False,
        use_cache=True,
        pad_token_id=0,
        eos_token_id=None,
    )


def check_same_tokens(checks: dict, tokens: torch.Tensor, expected: torch.Tensor, prompt: int, what: str) -> dict:
    """Record the first row's new tokens of the sharded (``tokens``) and the unsharded (``expected``) generate in
    ``checks``; CheckFailed naming ``what`` (e.g. ``generate under FSDP2``) when they differ. Returns ``checks``."""
    same = tokens.shape == expected.shape and bool(torch.equal(tokens, expected))
    checks.update(
        {
            "new_tokens_row0": tokens[0, prompt:].tolist(),
            "unsharded_new_tokens_row0": expected[0, prompt:].tolist(),
            "tokens_equal_unsharded": same,
        }
    )
    if not same:
        raise CheckFailed(
            f"{what} gave {tokens[:, prompt:].tolist()}, the unsharded model {expected[:, prompt:].tolist()}"
        )
    return checks
