"""Small builders shared by the unit tests."""

from __future__ import annotations

import copy

BASE = {
    "combos": [
        {
            "id": "current",
            "tags": ["cpu", "tests"],
            "pins": {
                "torch": "2.13.0",
                "peft": "0.21.2",
                "transformers": "5.23.0",
                "accelerate": "1.15.0",
                "bitsandbytes": "0.50.2",
            },
        }
    ],
    "cases": [
        {
            "id": "lora-requires-grad",
            "title": "t",
            "report": "seed 000",
            "repro": "repros/lora_requires_grad.py",
            "grids": [
                {"adapter": ["lora"], "dtype": ["fp32"], "orig": [0, 1], "wrap": ["decoder_layer"], "model": ["llama"]},
                {"adapter": ["lora"], "dtype": ["fp32"], "wrap": ["fsdp2"], "model": ["llama"]},
            ],
            "requires": [{"when": {"wrap": "fsdp2"}, "min_world_size": 2, "reason": "sharding needs 2 ranks"}],
            "expect": [
                {
                    "when": {"orig": 0, "wrap": "decoder_layer"},
                    "versions": {"torch": ">=2.1"},
                    "error": {
                        "type": "ValueError",
                        "match": "uniform `?requires_grad`?",
                        "module": "torch.distributed.fsdp._flat_param",
                    },
                    "source": "seed 000",
                },
                {
                    "when": {"orig": 0},
                    "versions": {"torch": "<2.1"},
                    "error": {"type": "ValueError", "match": "FlatParameter. requires uniform"},
                    "source": "seed 000",
                },
                {"versions": {"peft": "<0.11"}, "skip": "too old", "source": "observed"},
                {"ok": True, "source": "seed 000 fixes"},
            ],
        }
    ],
}


def matrix_data(**changes):
    data = copy.deepcopy(BASE)
    data.update(changes)
    return data
