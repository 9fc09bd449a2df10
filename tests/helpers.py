"""Small builders shared by the unit tests."""

from __future__ import annotations

import copy
import subprocess
import time
from pathlib import Path

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
            "report": "https://github.com/huggingface/peft/issues/1702",
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
                    "source": "peft#1702",
                },
                {
                    "when": {"orig": 0},
                    "versions": {"torch": "<2.1"},
                    "error": {"type": "ValueError", "match": "FlatParameter. requires uniform"},
                    "source": "peft#1702",
                },
                {"versions": {"peft": "<0.11"}, "skip": "too old", "source": "observed"},
                {"ok": True, "source": "peft#1702: the fixes"},
            ],
        }
    ],
}


def matrix_data(**changes):
    data = copy.deepcopy(BASE)
    data.update(changes)
    return data


def _edit(change):
    data = matrix_data()
    change(data["cases"][0])
    return data


BAD_INPUTS = {
    # defect -> (matrix data or YAML text, what the one line must name)
    "18-unknown-axis-in-when": (
        _edit(lambda c: c["expect"][0]["when"].update(wrapp="decoder_layer")),
        "expect[0].when.wrapp: unknown axis",
    ),
    "18-unknown-axis-in-requires": (
        _edit(lambda c: c["requires"][0]["when"].update(wrapz="fsdp2")),
        "requires[0].when.wrapz: unknown axis",
    ),
    "19-unknown-axis-value": (
        _edit(lambda c: c["expect"][0]["when"].update(wrap="decoder_layr")),
        "expect[0].when.wrap: unknown value 'decoder_layr'",
    ),
    "20-empty-axis": (_edit(lambda c: c["grids"][1].update(model=[])), "grids[1].model"),
    "21-missing-repro": (_edit(lambda c: c.update(repro="repros/not_there.py")), "repro: repros/not_there.py"),
    "22-duplicate-key": ("DUPLICATE", "duplicate key 'title'"),
    "23-empty-specifier": (
        _edit(lambda c: c["expect"][0]["versions"].update(torch="")),
        "expect[0].versions: empty specifier for torch",
    ),
    "25-nul-byte": ("NUL", "NUL"),
}


def write_matrix(folder: Path, data) -> Path:
    """matrix.yaml (and the repro files it names) in ``folder``; ``data`` is matrix data, or DUPLICATE / NUL for text
    that no dict can hold."""
    import yaml

    (folder / "repros").mkdir(parents=True, exist_ok=True)
    (folder / "repros" / "lora_requires_grad.py").write_text("CASE = 'lora-requires-grad'\n")
    if data == "DUPLICATE":
        text = yaml.safe_dump(matrix_data(), sort_keys=False).replace("  title: t\n", "  title: t\n  title: u\n", 1)
    elif data == "NUL":
        text = yaml.safe_dump(matrix_data(), sort_keys=False).replace("title: t", "title: t\x00", 1)
    else:
        text = yaml.safe_dump(data, sort_keys=False)
    path = folder / "matrix.yaml"
    path.write_text(text)
    return path


def wait_for_rank1_start(results: Path, proc: subprocess.Popen, timeout: float = 240) -> list:
    """Wait until rank 1 of a launch under ``results`` reports a cell's start (or ``proc`` ends); its event files."""
    deadline = time.monotonic() + timeout
    started = []
    while not started and time.monotonic() < deadline and proc.poll() is None:
        started = [f for f in results.glob("launches/*/launch-*/rank1.jsonl") if '"start"' in f.read_text()]
        time.sleep(0.1)
    assert started, "the cell never started"
    return started


def interrupting(how: str, ended: list):
    """A stand-in for a step that runs a launch: Ctrl-C (``how`` "sigint"), or SIGTERM sent to this process, while
    it runs; ``ended`` gets True when its ``finally`` (where LaunchRunner kills the launch) ran."""
    import os
    import signal

    def step(*args, **kwargs) -> None:
        try:
            if how == "sigint":
                raise KeyboardInterrupt
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(30)  # the handler interrupts this at once
        finally:
            ended.append(True)

    return step


def interrupted_in_one_line(main, argv, capsys, code: int, said: str, ended: list) -> None:
    """``main(argv)``, interrupted by its step, returns ``code`` with one stderr line saying ``said``, the step's
    ``finally`` ran, and the SIGTERM handler from before the command is back."""
    import signal

    import pytest

    def unhandled(signum, frame):
        raise RuntimeError("SIGTERM reached the handler that was there before the command")

    before = signal.signal(signal.SIGTERM, unhandled)  # without the command's own handler, SIGTERM ends pytest
    try:
        got = main(argv)
    except KeyboardInterrupt:  # not handled: it must not end the test session
        pytest.fail("KeyboardInterrupt escaped the command")
    finally:
        ours = signal.signal(signal.SIGTERM, before)
    assert got == code and ours is unhandled
    err = capsys.readouterr().err.strip()
    assert ended == [True] and said in err and len(err.splitlines()) == 1 and "Traceback" not in err, err
