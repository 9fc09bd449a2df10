"""Every number of the commands that launch cells is validated at parse time.

A bad number is one line naming the option and a non-zero exit: never a traceback, never junk records, never a
silent fallback to another value.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
FAULTS = HERE / "runner" / "fault_matrix.yaml"

BAD_NUMBERS = [
    ("--world-size", "0"),
    ("--world-size", "-1"),
    ("--world-size", "two"),
    ("--cell-timeout", "0"),
    ("--cell-timeout", "-5"),
    ("--cell-timeout", "nan"),
]


def _one_line(proc: subprocess.CompletedProcess, option: str) -> str:
    out = proc.stdout + proc.stderr
    assert proc.returncode not in (0, None), out
    assert "Traceback" not in out, out
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, out
    assert option in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("option,value", BAD_NUMBERS)
def test_run_refuses_a_bad_number_in_one_line(tmp_path, option, value):
    results = tmp_path / "res"
    cmd = [sys.executable, "-m", "fsdp_matrix", "run", "--matrix", str(FAULTS), "--cases", "healthy"]
    proc = subprocess.run(
        [*cmd, "--results", str(results), option, value], capture_output=True, text=True, timeout=300, cwd=REPO
    )
    _one_line(proc, option)
    assert not (results / "cells.jsonl").exists(), "junk records written"


@pytest.mark.parametrize(
    "where, said", [("afile", "not a directory"), ("missing", "no such directory"), ("/proc/self", "cannot write")]
)
def test_run_refuses_a_shared_dir_it_cannot_write_before_any_launch(tmp_path, where, said):
    """An unwritable --shared-dir made every checkpoint cell a REGRESSION on every node (PermissionError on one,
    "Connection closed by peer" on the others), labelled as a change of the library."""
    (tmp_path / "afile").write_text("x")
    folder = where if where.startswith("/") else str(tmp_path / where)
    results = tmp_path / "res"
    cmd = [sys.executable, "-m", "fsdp_matrix", "run", "--matrix", str(FAULTS), "--cases", "healthy"]
    proc = subprocess.run(
        [*cmd, "--results", str(results), "--shared-dir", folder], capture_output=True, text=True, timeout=300, cwd=REPO
    )
    assert proc.returncode == 2 and said in _one_line(proc, f"--shared-dir {folder}")
    assert not (results / "cells.jsonl").exists(), "records written"


@pytest.mark.parametrize("value", ["0", "-1"])
def test_pytest_refuses_a_bad_world_size(value):
    repros = REPO / "tests" / "test_repros.py"
    cmd = [sys.executable, "-m", "pytest", str(repros), "--collect-only", "-q", "-p", "no:cacheprovider"]
    proc = subprocess.run([*cmd, "--world-size", value], capture_output=True, text=True, timeout=300, cwd=REPO)
    out = proc.stdout + proc.stderr
    errors = [line for line in out.splitlines() if line.startswith("ERROR:")]
    assert proc.returncode != 0 and len(errors) == 1 and "--world-size" in errors[0], out
    assert "Traceback" not in out


@pytest.mark.parametrize("command", ["upgrade", "bisect"])
def test_bisect_commands_refuse_world_size_zero_before_anything_runs(command, capsys):
    if command == "upgrade":
        from fsdp_matrix.bisect.upgrade import parser

        argv = ["peft==0.14.0", "--world-size", "0"]
    else:
        from fsdp_matrix.bisect.cli import parser

        argv = ["some/cell", "--package", "peft", "--old", "0.13.2", "--new", "0.14.0", "--world-size", "0"]
    with pytest.raises(SystemExit) as exit_:
        parser().parse_args(argv)
    assert exit_.value.code not in (0, None)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and "--world-size" in lines[0], lines


@pytest.mark.parametrize(
    "args, named",
    [
        ("--nnodes=1:4 --rdzv-endpoint=h:1", "give a fixed node count"),
        ("--nnodes 1:2", "give a fixed node count"),
        ("--nproc-per-node=4", "ranks per node are --world-size's"),
        ("--nproc_per_node 4", "ranks per node are --world-size's"),
    ],
)
def test_torchrun_args_that_would_change_a_cells_world_size_are_refused(args, named):
    from fsdp_matrix import options

    with pytest.raises(options.OptionError) as info:
        options.check("torchrun_args", args)
    assert named in str(info.value) and str(info.value).startswith("--torchrun-args: ")


def test_torchrun_args_take_one_word_that_starts_with_a_dash(capsys):
    """``run --torchrun-args --nnodes=1:4`` said ``argument --torchrun-args: expected one argument`` (argparse took the
    one-word value for an option of its own): the value is read, and refused for what it says, in one line."""
    from fsdp_matrix.runner import cli

    assert cli.parser().parse_args(["--torchrun-args", "--nnodes=1"]).torchrun_args == "--nnodes=1"
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--torchrun-args", "--nnodes=1:4", "lora-requires-grad/lora-fp32-orig1-decoder_layer-llama-ws2"])
    assert exit_.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and "give a fixed node count" in lines[0], lines


def test_the_node_count_of_a_rendezvous():
    from fsdp_matrix.options import rendezvous_nodes

    assert rendezvous_nodes(["--standalone"]) == 1
    assert rendezvous_nodes(["--nnodes=2", "--node-rank=1"]) == 2
    assert rendezvous_nodes(["--nnodes", "3"]) == 3
    assert rendezvous_nodes(["--nnodes=1"]) == 1


# ----------------------------------------------------------------------------------- the matrix-reading commands


def test_versions_is_one_type_with_one_line_errors():
    from fsdp_matrix import options

    assert options.check("versions", "torch=2.6.0, peft==0.14.0") == {"torch": "2.6.0", "peft": "0.14.0"}
    for bad, said in [
        ("torch", "'torch': expected NAME=VERSION"),
        ("torch=two", "'torch=two': 'two' is not a version"),
        ("numpy=2.0", "'numpy=2.0': expected NAME=VERSION"),
        ("torch=2.6,peft=x", "'peft=x': 'x' is not a version"),
        (" , ", "names no version"),
    ]:
        with pytest.raises(options.OptionError) as err:
            options.check("versions", bad)
        assert str(err.value).startswith("--versions: ") and said in str(err.value), str(err.value)
        assert "\n" not in str(err.value)


@pytest.mark.parametrize("command", ["explain", "triage"])
def test_explain_and_triage_refuse_bad_versions_alike(command, capsys):
    from fsdp_matrix.cli import main

    assert main([command, "x/y", "--versions", "torch=two"]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and "--versions: 'torch=two': 'two' is not a version" in lines[0], lines


def test_to_argv_gives_the_options_back_through_the_parser():
    from fsdp_matrix import options

    launch = options.LaunchOptions(results=Path("r"), combo="old", world_size=4, resume=True, cases=["a", "b"])
    p = options.Parser(prog="t")
    options.add_arguments(p.add_argument)
    assert options.from_namespace(p.parse_args(options.to_argv(launch))) == launch
    names = ("results", "device", "world_size", "resume")
    assert options.to_argv(launch, names) == ["--results", "r", "--device", "cpu", "--world-size", "4", "--resume"]

    where = options.MatrixOptions(matrix=Path("m.yaml"), versions={"torch": "2.6.0", "peft": "0.14.0"})
    q = options.Parser(prog="t")
    options.add_arguments(q.add_argument, ("matrix", "versions"), model=options.MatrixOptions)
    parsed = q.parse_args(options.to_argv(where, ("matrix", "versions")))
    assert (parsed.matrix, parsed.versions) == (where.matrix, where.versions)
