"""Other releases' wordings of a message a rule matches: the same check in the same function, raised with other words
by a release the matrix does not run.

A rule's regex is written from the message its combos raise. A user on an older release pastes the same check's older
wording, which no regex of matrix.yaml holds (the rules say what was observed, and no combo runs those releases).
Each alias here is one check whose wording changed, read in both releases' sources; triage names the rule's case from
the older wording at ``likely`` evidence at most (``match.PARTIAL``), and says which wording it read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, List, Tuple


@dataclass(frozen=True)
class Alias:
    """Another release's wording of a message that a rule of matrix.yaml matches."""

    wording: re.Pattern[str]
    """The other wording, searched in a pasted message (or the paste's text: a title that quotes it)."""
    stands_for: str
    """The message as the rule's releases raise it: a rule whose regex finds it is the rule this alias stands for."""
    why: str
    """Where both wordings are raised (the upstream sources read), shown to the user with the fit."""


ALIASES: Tuple[Alias, ...] = (
    Alias(
        re.compile(r"Integer parameters are unsupported"),
        "Cannot flatten integer dtype tensors",
        # torch 2.0's torch/distributed/fsdp/flat_param.py (pytorch/pytorch at
        #   002159d15791e969ffa994863a7fda7ed8338937), FlatParamHandle._init_flat_param: `if dtype is None and not
        #   param.is_floating_point(): raise ValueError("Integer parameters are unsupported")`; from torch 2.1,
        #   FlatParamHandle._validate_tensors_to_flatten runs the same test and raises ValueError("Cannot flatten
        #   integer dtype tensors"). Reported under FSDP with a quantized (uint8 / int8) base: https://github.com/huggingface/accelerate/issues/1415,
        #   https://github.com/artidoro/qlora/issues/198, https://github.com/tatsu-lab/alpaca_farm/issues/63
        "torch <= 2.0's wording (flat_param.py, FlatParamHandle._init_flat_param) of the check torch >= 2.1 raises "
        "as 'Cannot flatten integer dtype tensors': the first parameter of an FSDP1 unit is not floating point",
    ),
    Alias(
        re.compile(
            r"(?:Must flatten tensors with|`?FlatParameter`? requires) uniform dtype but got "
            r"torch\.(?:bfloat16|float16|float32|float64) and torch\.u?int\d+"
        ),
        "Cannot flatten integer dtype tensors",
        # the same two functions: only the unit's first parameter meets the is_floating_point() test; an integer
        # parameter after a floating one fails the uniform-dtype test instead, naming the integer dtype second.
        # Reported with an 8-bit base: https://github.com/axolotl-ai-cloud/axolotl/issues/857
        "an integer parameter after a floating one in an FSDP1 unit: the uniform-dtype check meets it before the "
        "integer check (torch's FlatParamHandle, the same test as 'Cannot flatten integer dtype tensors')",
    ),
)
"""Each alias, with the upstream sources it was read from."""


def of(regex: Any) -> List[Alias]:
    """The aliases a rule's compiled regex (``search``) stands for: those whose message it finds."""
    return [alias for alias in ALIASES if regex.search(alias.stands_for)]
