"""The one wiring of bisect, bisect --git, upgrade and nightly: step options declared once, installer and runner."""

from __future__ import annotations

from pathlib import Path

import pytest

from fsdp_matrix.bisect.wiring import StepOptions, add_step_arguments, bisection_from
from fsdp_matrix.errors import EnvError
from fsdp_matrix.matrix import load_matrix
from fsdp_matrix.paths import DEFAULT_CACHE
from fsdp_matrix.usage import OneLineParser

FIXTURE = Path(__file__).parent / "fixtures" / "bisect_matrix.yaml"


def _parser(**kw) -> OneLineParser:
    p = OneLineParser(prog="t")
    add_step_arguments(p, **kw)
    return p


def test_step_options_and_their_defaults() -> None:
    args = _parser(timeout=900).parse_args([])
    assert StepOptions.from_args(args) == StepOptions(DEFAULT_CACHE, None, "cpu", None, 900)
    args = _parser(timeout=3600, world_size=2).parse_args(["--device", "cuda", "--cache", "c", "--timeout", "5"])
    assert StepOptions.from_args(args) == StepOptions(Path("c"), None, "cuda", 2, 5.0)


@pytest.mark.parametrize("argv", [["--device", "auto"], ["--timeout", "0"], ["--world-size", "0"]])
def test_a_bad_step_option_is_one_line(argv, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        _parser(timeout=900).parse_args(argv)
    assert exit_.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and argv[0] in lines[0], lines


def test_bisection_from_wires_the_combo_pins_and_the_step_options(tmp_path: Path) -> None:
    combo = load_matrix(FIXTURE).combo("old")
    opts = StepOptions(tmp_path / "cache", FIXTURE, "cpu", None, 60)
    wired = bisection_from(opts, combo, package="peft", pins={"accelerate": "1.2.1"}, world_size=4, bare=True)
    assert wired.installer.pins_for("0.14.0") == {**combo.pins.model_dump(), "accelerate": "1.2.1", "peft": "0.14.0"}
    assert wired.installer.cache == wired.runner.cache == tmp_path / "cache"
    runner = wired.runner
    assert (runner.matrix, runner.device, runner.world_size, runner.timeout, runner.bare) == (
        FIXTURE,
        "cpu",
        4,
        60,
        True,
    )
    assert bisection_from(opts, combo).runner.world_size == 2  # no cell's and none given: 2


def test_an_unusable_cache_is_refused_before_anything_is_wired(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    combo = load_matrix(FIXTURE).combo("old")
    with pytest.raises(EnvError, match="--cache"):
        bisection_from(StepOptions(tmp_path / "file"), combo)
