"""``python -m fsdp_matrix check [--accelerate-config F] [--training-args F] [--peft F] [--bnb F] [--versions ...]``.

Reads a user's FSDP and PEFT configs with each library's own loader, maps them onto the matrix's axes, and names the
known failures they will meet on the user's versions, before a job is launched: for each, the evidence (observed on
those versions, the nearest combo's records, or the rule's bounds), the nearest setting change that trains and the
first release that fixes it. Exit 1 when a known failure applies, 0 when none does, 2 for bad input, 3 when the
config is out of the matrix's scope (DeepSpeed, no FSDP). ``--json`` prints the same answer as one JSON object
(``fsdp_matrix.check.answer.CheckAnswer``); ``--run`` then runs the matching cells here, through the runner.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import yaml

from fsdp_matrix import options
from fsdp_matrix.check.answer import EXIT_BAD_INPUT
from fsdp_matrix.errors import MatrixError
from fsdp_matrix.installed import installed_versions
from fsdp_matrix.matrix import Matrix, load_matrix
from fsdp_matrix.rules import RULE_PACKAGES
from fsdp_matrix.usage import OneLineParser, flat

FILES = (
    ("accelerate_config", "accelerate", "an accelerate config YAML, as `accelerate config` writes it"),
    ("training_args", "training_args", "TrainingArguments / TRL SFTConfig or DPOConfig fields, JSON or YAML"),
    ("peft", "peft", "adapter_config.json (or a directory holding one)"),
    ("bnb", "bnb", "a BitsAndBytesConfig as JSON or YAML (or a model config with quantization_config)"),
)
"""(option dest, reading kind, help)."""
LAYOUT_KEYS = ("entry", "world_size", "nodes")


class CheckError(MatrixError):
    """An option cannot be used as given."""


def parser() -> OneLineParser:
    p = OneLineParser(prog="fsdp_matrix check", description=__doc__.split("\n\n")[1].replace("\n", " "))
    for dest, _, help_ in FILES:
        p.add_argument("--" + dest.replace("_", "-"), dest=dest, type=Path, metavar="FILE", help=help_)
    options.add_arguments(p.add_argument, ("matrix",), model=options.MatrixOptions)
    options.add_arguments(p.add_argument, ("results",), defaults={"results": None}, model=options.MatrixOptions)
    p.add_argument("--history", type=Path, metavar="DB", help="a history DB (python -m fsdp_matrix history add)")
    options.add_arguments(p.add_argument, ("versions",), model=options.MatrixOptions, typed=False)
    p.add_argument("--set", action="append", default=[], metavar="AXIS=VALUE",
                   help="a setting no file gives (dtype=bf16, wrap=peft_policy, model=gemma, entry=trl)")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print the answer as one JSON object")
    p.add_argument("--run", action="store_true", help="then run the matching CPU cells here, through the runner")
    p.add_argument("--run-results", type=Path, default=Path("results") / "check", metavar="DIR",
                   help="where --run writes its records (default: results/check)")  # fmt: skip
    return p


def overrides(matrix: Matrix, items: List[str]) -> Dict[str, Any]:
    """``--set axis=value`` items, each axis one of matrix.yaml's (or entry, world_size, nodes)."""
    axes = set(matrix.axes or {}) | {a for c in matrix.cases for a in c.axes}
    out: Dict[str, Any] = {}
    for item in items:
        axis, sep, text = item.partition("=")
        if not sep or (axis not in axes and axis not in LAYOUT_KEYS):
            raise CheckError(f"--set {item!r}: give AXIS=VALUE with AXIS an axis of matrix.yaml or {LAYOUT_KEYS}")
        out[axis] = yaml.safe_load(text) if text else text
    return out


def versions_for(given: Optional[str]) -> Tuple[Dict[str, Optional[str]], str]:
    """The user's versions: the installed ones, with those given on top."""
    versions = installed_versions(RULE_PACKAGES)
    if given is None:
        return versions, "installed here"
    named = options.check("versions", given)
    versions.update(named)
    rest = [p for p in RULE_PACKAGES if p not in named]
    return versions, "given with --versions" + (f"; {', '.join(rest)} installed here" if rest else "")


def _seen(args) -> Tuple[list, Optional[str]]:
    from fsdp_matrix.check.seen import from_history, from_results

    seen, lines = [], []
    for path, reader in ((args.results, from_results), (args.history, from_history)):
        if path is not None:
            more, line = reader(path)
            seen += more
            lines.append(line)
    return seen, "; ".join(lines) or None


def answer(args) -> Tuple[Any, Any, Matrix]:
    """(answer, setup, matrix) for parsed arguments."""
    from fsdp_matrix.check import build, setup, where

    matrix = load_matrix(args.matrix, check_repros=False)
    versions, versions_from = versions_for(args.versions)
    files = {kind: getattr(args, dest) for dest, kind, _ in FILES if getattr(args, dest) is not None}
    sets = overrides(matrix, args.set)
    if not files and not sets:
        raise CheckError("give at least one file (--accelerate-config, --training-args, --peft, --bnb) or --set")
    seen, records = _seen(args)
    read = where.read(matrix, files, versions)
    mapped = setup.build(read.readings, sets)
    result = build.build(matrix, mapped, read.readings, read.where, versions, versions_from, seen, records)
    return result, mapped, matrix


def main(argv: Optional[List[str]] = None) -> int:
    args = parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    from fsdp_matrix.check.read import ReadError
    from fsdp_matrix.check.render import render_text

    try:
        result, mapped, matrix = answer(args)
    except ReadError as exc:
        print(f"fsdp_matrix check: {flat(exc)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    sys.stdout.write(result.model_dump_json(indent=2) + "\n" if args.json else render_text(result))
    status = result.exit_status
    if args.run and not result.out_of_scope:
        from fsdp_matrix.check.run import run_matching

        ran = run_matching(matrix, mapped, args, out=sys.stderr if args.json else sys.stdout)
        status = max(status, ran)
    return status
