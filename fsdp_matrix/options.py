"""The options of every command, declared once: ``LaunchOptions`` for the commands that launch cells,
``MatrixOptions`` for those that read the matrix and its records (explain, triage, export, report, standalone).

``run``, ``bench``, the pytest plugin, ``nox -s matrix -- ...`` and the launch options of ``bisect``, ``upgrade`` and
``nightly`` all take their options from ``LaunchOptions``: the same flag, help, default and bounds everywhere. Each
field's docstring is its ``--help`` text. ``add_arguments`` turns fields into argparse arguments (or pytest
options), ``from_namespace`` turns what was parsed back into a validated ``LaunchOptions``, and ``to_argv`` turns one
into the argv of another command (a step of bisect runs ``python -m fsdp_matrix run`` with it).

Every number is checked here, at parse time, by the field's own bounds: a bad one is one line naming the option.
This module imports neither torch nor the runner, so ``report``-like commands and noxfile.py can use it cheaply.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import (
    Annotated,
    Any,
    Callable,
    Dict,
    Iterable,
    List,
    Literal,
    Optional,
    Sequence,
    get_args,
    get_origin,
)

from packaging.version import InvalidVersion, Version
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from fsdp_matrix.errors import EnvError
from fsdp_matrix.paths import writable_folder
from fsdp_matrix.rules import RULE_PACKAGES
from fsdp_matrix.usage import OneLineParser

CELL_TIMEOUT_S = 180.0
"""The one default of the cell timeout, for every command and for ``Launcher``."""
MAX_WORLD_SIZE = 1024
"""Ranks per node above this are a typo, not a machine: refused before torchrun starts that many processes."""
MAX_CELL_TIMEOUT_S = 7 * 86400.0
CONCRETE_DEVICE = {"device": ("cpu", "cuda")}
"""``choices`` for a command that installs envs for a device, where ``auto`` means nothing."""


class OptionError(ValueError):
    """A bad option value: one line naming the option."""


class LaunchOptions(BaseModel):
    """What a command that launches cells needs to know: where records go, which cells, on what, for how long."""

    model_config = ConfigDict(use_attribute_docstrings=True, extra="forbid", frozen=True)

    results: Path = Path("results")
    """Directory of cells.jsonl (and of the launch directories, under launches/)."""
    matrix: Optional[Path] = None
    """matrix.yaml to use (default: the repo's)."""
    device: Literal["auto", "cpu", "cuda"] = "cpu"
    """cpu (gloo) or cuda (nccl, one GPU per rank); auto picks cuda when a GPU is visible."""
    world_size: Optional[Annotated[int, Field(ge=1, le=MAX_WORLD_SIZE)]] = None
    """Ranks per node of the cells whose grid names no world size (default: 2; 1 on a machine with one GPU); their
    ids say the global world size (x the --nnodes of --torchrun-args)."""
    combo: Optional[str] = None
    """matrix.yaml combo id this env was built for (nox sets it); records are filed under it."""
    cases: Optional[List[str]] = None
    """Case ids to run, comma-separated, repeatable (default: every case)."""
    resume: bool = False
    """Keep cells whose newest record, made with this env's installed versions under the rule that decides the cell
    now, is an outcome; run the rest (a cell whose rule changed since runs again)."""
    cell_timeout: Annotated[float, Field(gt=0, le=MAX_CELL_TIMEOUT_S, allow_inf_nan=False)] = CELL_TIMEOUT_S
    """Seconds a cell may run on any rank before it counts as hung (also the ranks' process-group timeout)."""
    shared_dir: Optional[Path] = None
    """A folder every node sees (shared storage), the same path on each, for what one rank writes and every rank
    reads (checkpoints) in a rendezvous of several machines (--torchrun-args --nnodes); not needed on one machine."""
    share_gpu: bool = False
    """On cuda, let ranks share the GPUs when there are fewer than ranks: rank i on cuda:(i mod GPUs), each with its own
    NCCL_HOSTID, so NCCL's duplicate-GPU check passes and it talks over its network transport (one GPU can then run
    the 2-rank cells; slower, not faster: docs/pages/gpu.md)."""
    torchrun_args: str = "--standalone"
    """Rendezvous options passed to torchrun, e.g. for multi-node: '--nnodes=2 --node-rank=N --rdzv-endpoint=HOST:PORT
    ...' (a fixed node count: each cell runs at the world size its id names)."""

    @field_validator("cases", mode="before")
    @classmethod
    def _split_cases(cls, value: Any) -> Any:
        if value is None:
            return None
        if isinstance(value, str):
            value = [value]
        if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            ids = [c.strip() for text in value for c in text.split(",") if c.strip()]
            if not ids:  # a blank or comma-only value (an unset variable in a script) is no selection of every case
                raise ValueError("names no case: give case ids, comma-separated, or leave it out")
            return ids
        return value

    @field_validator("torchrun_args")
    @classmethod
    def _torchrun_args_split(cls, value: str) -> str:
        import shlex

        try:
            words = shlex.split(value)
        except ValueError as exc:
            raise ValueError(f"cannot split into words: {exc}") from None
        for word in words:
            if word.split("=", 1)[0].replace("_", "-") == "--nproc-per-node":
                raise ValueError("ranks per node are --world-size's (a cell's world size is in its id), not torchrun's")
        rendezvous_nodes(words)
        return value

    @property
    def torchrun_argv(self) -> List[str]:
        import shlex

        return shlex.split(self.torchrun_args) or ["--standalone"]


FIELDS = tuple(LaunchOptions.model_fields)


def parse_versions(text: str) -> Dict[str, str]:
    """``torch=2.6.0,peft=0.14.0`` -> {package: version}: the one reading of ``--versions``. ValueError (one line)
    naming a bad item, or for a text that names no version at all (an unset variable in a script)."""
    items = [part.strip() for part in text.split(",") if part.strip()]
    if not items:
        raise ValueError("names no version: give NAME=VERSION,... or leave it out")
    out: Dict[str, str] = {}
    for item in items:
        named = "" if len(items) == 1 else f"{item!r}: "
        name, sep, version = item.partition("=")
        name, version = name.strip().lower(), version.strip().lstrip("=")
        if not sep or not version or name not in RULE_PACKAGES:
            raise ValueError(f"{named}expected NAME=VERSION with NAME one of {', '.join(RULE_PACKAGES)}")
        try:
            Version(version)
        except InvalidVersion:
            raise ValueError(f"{named}{version!r} is not a version") from None
        out[name] = version
    return out


class MatrixOptions(BaseModel):
    """What a command that reads the matrix and its records needs: which matrix, which records, which combo, on what
    device, with which versions. The fields it shares with LaunchOptions mean the same there."""

    model_config = ConfigDict(use_attribute_docstrings=True, extra="forbid", frozen=True)

    matrix: Optional[Path] = None
    """matrix.yaml to use (default: the repo's)."""
    results: Optional[Path] = Path("results")
    """A results dir (or one cells.jsonl) whose records are read."""
    combo: Optional[str] = None
    """matrix.yaml combo id whose pins are used (bisect, upgrade, export: default the newest CPU combo)."""
    device: Literal["auto", "cpu", "cuda"] = "cpu"
    """cpu or cuda (auto picks cuda when a GPU is visible)."""
    versions: Optional[Dict[str, str]] = None
    """Package versions, NAME=VERSION,... (e.g. torch=2.6.0,peft=0.14.0)."""

    @field_validator("versions", mode="before")
    @classmethod
    def _parse_versions(cls, value: Any) -> Any:
        return parse_versions(value) if isinstance(value, str) else value


def _model(name: str, model: Optional[type] = None) -> type:
    """The model that declares ``name``: the one given, else LaunchOptions, else MatrixOptions."""
    if model is not None:
        return model
    return LaunchOptions if name in LaunchOptions.model_fields else MatrixOptions


def rendezvous_nodes(words: Sequence[str]) -> int:
    """The node count that torchrun args (split into words) ask for: their ``--nnodes=N`` (or ``--nnodes N``),
    else 1. An elastic range (``1:4``) is refused (ValueError): a cell must run at the world size its id names."""
    for i, word in enumerate(words):
        name, eq, text = word.partition("=")
        if name.replace("_", "-") != "--nnodes":
            continue
        text = text if eq else (words[i + 1] if i + 1 < len(words) else "")
        if not text.isdigit() or int(text) < 1:
            raise ValueError(f"--nnodes={text}: give a fixed node count (a cell runs at the world size its id names)")
        return int(text)
    return 1


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _message(exc: ValidationError) -> str:
    err = exc.errors(include_url=False)[0]
    msg = err["msg"].removeprefix("Value error, ")
    return msg[:1].lower() + msg[1:]


def check(name: str, raw: Any, model: Optional[type] = None) -> Any:
    """The value of option ``name`` from its command-line text (or value), by the field's bounds; OptionError names
    the option. The one place every option is validated."""
    try:
        model = _model(name, model).model_validate({name: raw})
    except ValidationError as exc:
        raise OptionError(f"{flag(name)}: {_shown(raw)}: {_message(exc)}") from None
    return getattr(model, name)


def _shown(raw: Any) -> str:
    text = repr(raw)
    return text if len(text) <= 60 else text[:57] + "...'"


def _arg_type(name: str, model: Optional[type] = None) -> Callable[[str], Any]:
    def convert(text: str) -> Any:
        try:
            return check(name, text, model)
        except OptionError as exc:
            # argparse prefixes "argument --flag:" itself
            raise argparse.ArgumentTypeError(str(exc).split(": ", 1)[1]) from None

    convert.__name__ = name  # argparse names the type in some messages
    return convert


def add_arguments(
    add: Callable[..., Any],
    names: Iterable[str] = FIELDS,
    *,
    defaults: Optional[Dict[str, Any]] = None,
    choices: Optional[Dict[str, Sequence[Any]]] = None,
    typed: bool = True,
    model: Optional[type] = None,
) -> None:
    """Declare fields ``names`` through ``add`` (``parser.add_argument``, a group's, or pytest's ``addoption``).

    ``defaults`` overrides a field's default for this command only (pytest's device is ``auto``). With ``typed``,
    argparse validates each value as it parses; pytest instead validates in ``from_namespace`` (``typed=False``),
    so its error is one ``ERROR:`` line rather than a usage text. ``choices`` narrows a field's values for a command
    that cannot take them all (bisect's installers need a concrete device, not ``auto``). ``model``: the options
    model declaring ``names`` (default: LaunchOptions for its fields, else MatrixOptions).
    """
    defaults, choices = defaults or {}, choices or {}
    for name in names:
        info = _model(name, model).model_fields[name]
        default = defaults.get(name, info.default)
        help_ = (info.description or "").rstrip(".")
        if info.annotation is bool:
            add(flag(name), action="store_true", default=bool(default), help=help_)
            continue
        kwargs: Dict[str, Any] = {"default": None if name == "cases" else default, "help": help_}
        if get_origin(info.annotation) is Literal:
            kwargs["metavar"] = "{" + ",".join(choices.get(name) or get_args(info.annotation)) + "}"
        if name in choices:
            kwargs["choices"] = list(choices[name])
        if name == "cases":
            kwargs["action"] = "append"
        elif typed:
            kwargs["type"] = _arg_type(name, model)
        if default is not None and name != "cases":
            kwargs["help"] += f" (default: {default})"
        add(flag(name), **kwargs)


def from_namespace(ns: Any, names: Iterable[str] = FIELDS) -> LaunchOptions:
    """A validated LaunchOptions from parsed options (an argparse namespace, or anything with those attributes);
    a field that is absent or None takes its default. Raises OptionError naming the option."""
    values = {}
    for name in names:
        raw = getattr(ns, name, None)
        if raw is not None:
            values[name] = check(name, raw)
    opts = LaunchOptions(**values)
    if opts.shared_dir is not None:
        # every node checks its own mount before the first launch: a folder a rank cannot write made every
        # checkpoint cell a false REGRESSION on every node
        try:
            writable_folder(opts.shared_dir)
        except EnvError as exc:
            raise OptionError(str(exc)) from None
    return opts


def to_argv(opts: BaseModel, names: Optional[Sequence[str]] = None) -> List[str]:
    """The argv that gives ``opts`` back when parsed (fields that differ from their defaults; all of ``names``
    when given)."""
    out: List[str] = []
    for name in names or tuple(type(opts).model_fields):
        value = getattr(opts, name)
        info = type(opts).model_fields[name]
        if names is None and value == info.default:
            continue
        if value is None:
            continue
        if isinstance(value, bool):
            out += [flag(name)] if value else []
        elif isinstance(value, list):
            out += [flag(name), ",".join(value)]
        elif isinstance(value, dict):
            out += [flag(name), ",".join(f"{k}={v}" for k, v in value.items())]
        elif isinstance(value, float):
            out += [flag(name), repr(value) if math.isfinite(value) else str(value)]
        else:
            out += [flag(name), str(value)]
    return out


_WORDS_OPTIONS = ("--torchrun-args",)
"""Options whose value is another program's arguments: often one word starting with ``-`` (``--nnodes=2``)."""


def _glued(argv: Sequence[str]) -> List[str]:
    """``argv`` with each of _WORDS_OPTIONS joined to its value (``--torchrun-args=--nnodes=2``): argparse takes a
    separate value that starts with ``-`` for an option of its own and says "expected one argument"."""
    out: List[str] = []
    words = iter(argv)
    for word in words:
        value = next(words, None) if word in _WORDS_OPTIONS else None
        out.append(word if value is None else f"{word}={value}")
    return out


class Parser(OneLineParser):
    """argparse whose errors are one line (``prog: error: message (see prog --help)``): the one usage-error style;
    ``--torchrun-args`` takes a value starting with ``-`` as one word too."""

    def parse_known_args(self, args: Optional[Sequence[str]] = None, namespace: Any = None) -> Any:
        return super().parse_known_args(_glued(sys.argv[1:] if args is None else args), namespace)
