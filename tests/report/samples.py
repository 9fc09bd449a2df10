"""Synthetic cell records for the report and diff tests, built from the records dataclasses."""

from __future__ import annotations

from typing import Optional

from fsdp_matrix.records import Observed, RankResult, Record

HOSTILE = "<script>alert('x')</script> & \"quoted\" `backticks` | pipe <b>bold</b>\x1b[31mred\x1b[0m"
VERSIONS = {
    "torch": "2.13.0+cpu",
    "peft": "0.21.2",
    "transformers": "5.23.0",
    "accelerate": "1.15.0",
    "bitsandbytes": None,
    "python": "3.11.9",
}
STATUS = {
    "reproduced": "error",
    "fix-holds": "ok",
    "REGRESSION": "error",
    "UNEXPECTED-FIX": "ok",
    "DIFFERENT-ERROR": "error",
    "hang": "hang",
    "crash": "crash",
    "skipped": "skipped",
    "env-error": "env-error",
}


def make_record(
    cell: str,
    verdict: str,
    combo: Optional[str] = "cur",
    case: str = "dora",
    message: str = "boom",
    finished_at: float = 1000.0,
    versions: Optional[dict] = None,
) -> Record:
    status = STATUS[verdict]
    err = status == "error"
    ranks = [
        RankResult(
            rank=r,
            status=status,
            error_type="ValueError" if err else None,
            error_message=message if err else None,
            traceback=f"Traceback (most recent call last):\n  rank {r}\nValueError: {message}" if err else None,
            exit_code=-9 if status == "crash" else None,
        )
        for r in range(2)
    ]
    obs = Observed(
        status=status,
        error_type="ValueError" if err else None,
        error_message=message if err else None,
        location="torch.distributed.fsdp._flat_param.f" if err else None,
        ranks=ranks,
    )
    return Record(
        case=case,
        cell=cell,
        params={"adapter": "dora"},
        versions=dict(versions or VERSIONS),
        device="cpu",
        world_size=2,
        expected={"kind": "ok", "rule": 0, "source": "seed"},
        observed=obs,
        verdict=verdict,
        duration_s=1.5,
        line=f"expected ok / observed {status} ({message})",
        combo=combo,
        finished_at=finished_at,
    )


MATRIX = {
    "combos": [
        {
            "id": "new",
            "pins": {
                "torch": "2.13.0",
                "peft": "0.21.2",
                "transformers": "5.23.0",
                "accelerate": "1.15.0",
                "bitsandbytes": "0.50.2",
            },
        },
        {
            "id": "old",
            "pins": {
                "torch": "2.1.2",
                "peft": "0.10.0",
                "transformers": "4.40.0",
                "accelerate": "0.30.0",
                "bitsandbytes": "0.43.0",
            },
        },
        {
            "id": "never",
            "pins": {
                "torch": "2.1.2",
                "peft": "0.10.0",
                "transformers": "4.40.0",
                "accelerate": "0.30.0",
                "bitsandbytes": "0.43.0",
            },
        },
    ],
    "cases": [
        {
            "id": "zeta",
            "title": "Zeta case",
            "report": "r",
            "repro": "repros/z.py",
            "grids": [{"adapter": ["lora", "dora"]}],
            "expect": [{"ok": True, "source": "s"}],
        },
        {
            "id": "alpha",
            "title": "Alpha case",
            "report": "r",
            "repro": "repros/a.py",
            "grids": [{"adapter": ["lora"]}],
            "expect": [{"ok": True, "source": "s"}],
        },
    ],
}


def sample_records():
    return [
        make_record("lora-ws2", "fix-holds", "old", case="zeta"),
        make_record("dora-ws2", "REGRESSION", "old", case="zeta", message=HOSTILE),
        make_record("lora-ws2", "reproduced", "new", case="alpha"),
        make_record("lora-ws2", "skipped", "new", case="zeta"),
        make_record("dora-ws2", "hang", "new", case="zeta"),
    ]
