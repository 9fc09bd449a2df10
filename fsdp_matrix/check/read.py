"""Read a user's config files with each library's own loader, never by hand, so that a field a release renamed or
dropped is reported the way that release reports it, and a typo is caught:

- an ``accelerate config`` YAML: ``accelerate.commands.config.config_args.load_config_from_file`` (unknown top-level
  keys are refused there), then ``accelerate launch``'s own option handling (``_validate_launch_command`` and
  ``prepare_multi_gpu_env``) gives the variables the launcher would export; an ``fsdp_config`` key that is not an
  option of that release's launcher is named (the launcher drops it without a word);
- ``TrainingArguments`` (or TRL's ``SFTConfig`` / ``DPOConfig`` when the file has TRL fields): transformers'
  ``HfArgumentParser.parse_dict`` (an unknown key is refused there), and the variables ``__post_init__`` exports for
  accelerate (what the Trainer's FSDP plugin is built from);
- ``adapter_config.json``: ``peft.PeftConfig.from_pretrained``;
- a quantization config: ``transformers.BitsAndBytesConfig.from_dict``.

What each release warns while reading is kept, worded as it words it. This module runs in whatever env holds the
libraries: ``python -m fsdp_matrix.check.read`` prints the readings as JSON, so that ``check`` can read an old config
in the env of the combo whose pins match (``fsdp_matrix.check.where``).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import shutil
import sys
import tempfile
import warnings
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from fsdp_matrix.errors import MatrixError
from fsdp_matrix.installed import installed_versions

READ_PACKAGES = ("accelerate", "transformers", "peft", "trl")
"""The libraries whose loaders read the files: the env that reads them must have the user's versions of these."""
KINDS = ("accelerate", "training_args", "peft", "bnb")
"""The files ``check`` reads, by the option that names each."""
DEFAULT_PROCESSES = 2
"""Processes a config without ``num_processes`` is read with (its launch passes ``--num_processes``)."""
TRL_CLASSES = ("SFTConfig", "DPOConfig")
"""TRL's config classes tried, in order, when ``TrainingArguments`` does not take every key."""


class ReadError(MatrixError):
    """A library refuses the file (its own one-line message), or the file cannot be read."""


@dataclass
class Reading:
    """One file as its library read it."""

    kind: str
    """``accelerate``, ``training_args``, ``peft`` or ``bnb``."""
    path: str
    """The file read."""
    loader: str
    """The library call that read it: ``transformers 4.46.3 HfArgumentParser(SFTConfig).parse_dict``."""
    settings: Dict[str, Any]
    """Every setting in the file, as given (nested sections flattened: ``fsdp_config.fsdp_use_orig_params``)."""
    effective: Dict[str, Any] = field(default_factory=dict)
    """What the library made of them: the resolved fields, and ``env.NAME`` for each variable it exports."""
    notes: List[str] = field(default_factory=list)
    """What the library warned or dropped while reading, in its words."""
    versions: Dict[str, Optional[str]] = field(default_factory=dict)
    """The versions of the libraries that read it."""
    cls: str = ""
    """The config class that took the file (``TrainingArguments``, ``SFTConfig``, ``LoraConfig``...)."""

    def to_json(self) -> Dict[str, Any]:
        return asdict(self)


def plain(value: Any) -> Any:
    """A value as JSON holds it: an enum as its value, a dtype as its name, containers recursively."""
    if isinstance(value, Enum):
        return plain(value.value)
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value).removeprefix("torch.")


def flatten(data: Dict[str, Any], prefix: str = "") -> Dict[str, Any]:
    """``{fsdp_config: {a: 1}}`` -> ``{fsdp_config.a: 1}``: every setting on its own, so none is dropped unseen."""
    out: Dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, name + "."))
        else:
            out[name] = plain(value)
    return out


def _load_mapping(path: Path) -> Dict[str, Any]:
    """The file's mapping, for listing its settings (YAML reads JSON too); the libraries read it again their way."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ReadError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ReadError(f"{path}: not YAML or JSON: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise ReadError(f"{path}: holds {type(data).__name__}, not a mapping of settings")
    return data


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: List[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@contextlib.contextmanager
def _quiet(notes: List[str]) -> Iterator[None]:
    """Collect the libraries' warnings (``warnings`` and their loggers) into ``notes``; print nothing; leave the
    process's environment as it was (TrainingArguments and the launcher export variables)."""
    saved = dict(os.environ)
    handler = _Collect()
    loggers = [logging.getLogger(n) for n in ("transformers", "peft", "accelerate", "trl")]
    # their own handlers print to the terminal: set aside while reading, the warnings go to ``notes``
    own = {lg.name: lg.handlers[:] for lg in loggers}
    for lg in loggers:
        lg.handlers = [handler]
    try:
        with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("always")
            yield
    finally:
        for lg in loggers:
            lg.handlers = own[lg.name]
        os.environ.clear()
        os.environ.update(saved)
    for line in [str(w.message) for w in caught] + handler.lines:
        first = line.strip().splitlines()[0] if line.strip() else ""
        if first and first not in notes:
            notes.append(first)


def _version(package: str) -> str:
    return f"{package} {installed_versions([package])[package] or '(not installed)'}"


def read_accelerate(path: Path) -> Reading:
    """An ``accelerate config`` file through accelerate's own config classes and launcher."""
    from accelerate.commands.config.config_args import load_config_from_file

    raw = _load_mapping(path)
    reading = Reading("accelerate", str(path), f"{_version('accelerate')} load_config_from_file", flatten(raw))
    with _quiet(reading.notes):
        try:
            config = load_config_from_file(str(path))
        except (ValueError, TypeError, KeyError) as exc:
            raise ReadError(f"{path}: {_version('accelerate')} refuses it: {exc}") from None
    reading.cls = type(config).__name__
    distributed = plain(config.distributed_type)
    reading.effective.update(
        distributed_type=distributed,
        num_processes=config.num_processes,
        num_machines=getattr(config, "num_machines", 1),
        use_cpu=bool(config.use_cpu),
        mixed_precision=plain(config.mixed_precision),
    )
    if distributed == "FSDP":
        _launcher(path, raw, reading)
    return reading


def _launcher(path: Path, raw: Dict[str, Any], reading: Reading) -> None:
    """What ``accelerate launch --config_file PATH`` exports, from the launcher's own code; fsdp_config keys that
    are none of its options are named (it sets them on its namespace and never reads them)."""
    from accelerate.commands import launch
    from accelerate.utils.launch import prepare_multi_gpu_env

    parser = launch.launch_command_parser()
    argv = ["--config_file", str(path), "train.py"]
    if "num_processes" not in raw:  # the launcher refuses it without one: given on its command line instead
        argv[:0] = ["--num_processes", str(DEFAULT_PROCESSES)]
        reading.notes.append(
            f"the config names no num_processes (accelerate launch then needs --num_processes): read with "
            f"{DEFAULT_PROCESSES}; --set world_size=N gives yours"
        )
    with _quiet(reading.notes):
        try:
            args = parser.parse_args(argv)
            out = launch._validate_launch_command(args)
            args = out[0] if isinstance(out, tuple) else args
            env = prepare_multi_gpu_env(args)
        except (ValueError, TypeError, KeyError, SystemExit) as exc:
            raise ReadError(f"{path}: {_version('accelerate')}'s launcher refuses it: {exc}") from None
    reading.loader += " + accelerate launch (_validate_launch_command, prepare_multi_gpu_env)"
    dests = {a.dest for a in parser._actions}
    for key in (raw.get("fsdp_config") or {}).keys():
        option = key if "fsdp" in key else f"fsdp_{key}"
        if option not in dests:
            reading.notes.append(
                f"fsdp_config.{key}: not an option of {_version('accelerate')}'s launcher: it exports nothing for it"
            )
    reading.effective.update({f"env.{k}": v for k, v in env.items() if k.startswith(("FSDP_", "ACCELERATE_"))})
    reading.effective["num_processes"] = args.num_processes
    reading.effective["num_machines"] = args.num_machines


def _argument_classes(raw: Dict[str, Any]) -> List[Tuple[str, Any]]:
    """TrainingArguments, then TRL's config classes when trl is installed."""
    from transformers import TrainingArguments

    out: List[Tuple[str, Any]] = [("TrainingArguments", TrainingArguments)]
    try:
        import trl
    except ImportError:
        return out
    return out + [(name, getattr(trl, name)) for name in TRL_CLASSES if hasattr(trl, name)]


UNUSED = "not used by the HfArgumentParser"
"""HfArgumentParser's words for keys no field of the class takes (the next class is tried)."""


def _try(cls: Any, given: Dict[str, Any], reading: Reading) -> Tuple[Any, str, Dict[str, str]]:
    """(arguments or None, the refusal, the variables ``__post_init__`` exported) for one class."""
    from transformers import HfArgumentParser

    before = dict(os.environ)
    with _quiet(reading.notes):
        try:
            (args,) = HfArgumentParser(cls).parse_dict(given, allow_extra_keys=False)
        except ValueError as exc:
            return None, str(exc).splitlines()[0], {}
        exported = {k: v for k, v in os.environ.items() if before.get(k) != v}
    return args, "", exported


HALF = ("fp16", "bf16", "fp16_full_eval", "bf16_full_eval", "tf32")
"""Precision flags a release may refuse on a machine without a GPU (bf16 without one; fp16 on any CPU in 4.x; tf32
without an Ampere GPU)."""


def _on_this_machine(cls: Any, given: Dict[str, Any], error: str, reading: Reading) -> Tuple[Any, str, Dict]:
    """A refusal for this machine, read again as if on a CPU (``use_cpu=True``, then without the half-precision
    flags as well); the flags given are put back on the arguments and a note says what was done."""
    half = {k: False for k in HALF if given.get(k)}
    for extra in ({"use_cpu": True}, {"use_cpu": True, **half}) if half else ({"use_cpu": True},):
        args, again, exported = _try(cls, {**given, **extra}, reading)
        if UNUSED in again:
            return None, again, {}
        if args is not None:
            shown = ", ".join(f"{k}={v}" for k, v in extra.items())
            reading.notes.append(f"{error} (no GPU on this machine: read again with {shown}, then set back)")
            for key in extra:
                setattr(args, key, given.get(key, False))
            return args, "", {k: v for k, v in exported.items() if "USE_CPU" not in k}
    return None, error, {}


def _parse_args(raw: Dict[str, Any], reading: Reading) -> Any:
    """The first class of ``_argument_classes`` that takes every key, through HfArgumentParser.parse_dict. A
    refusal for this machine (bf16 or fp16 without a GPU here) is read again with ``use_cpu=True`` and said so."""
    given = dict(raw)
    if "output_dir" not in given:  # required by older releases; nothing is written there
        given["output_dir"] = os.path.join(tempfile.gettempdir(), "fsdp-matrix-check-unused")
    refused: List[str] = []
    for name, cls in _argument_classes(raw):
        args, error, exported = _try(cls, given, reading)
        if args is None and UNUSED not in error and "use_cpu" not in given:
            args, error, exported = _on_this_machine(cls, given, error, reading)
        if args is not None:
            reading.cls = name
            reading.effective.update(
                {f"env.{k}": v for k, v in exported.items() if k.startswith(("FSDP_", "ACCELERATE_"))}
            )
            return args
        refused.append(f"{name}: {error}")
        if UNUSED not in error:
            break  # the values are refused, not the keys: another class would refuse them too
    trl = (
        "" if len(refused) > 1 or UNUSED not in refused[0] else " (trl is not installed here: TRL's classes not tried)"
    )
    raise ReadError(f"{reading.path}: {_version('transformers')} refuses it: {'; '.join(refused)}{trl}")


ARGUMENT_FIELDS = (
    "fsdp", "fsdp_config", "gradient_accumulation_steps", "max_grad_norm", "torch_compile", "torch_compile_backend",
    "gradient_checkpointing", "gradient_checkpointing_kwargs", "bf16", "fp16", "use_cpu",
)  # fmt: skip
"""The resolved fields the mapping reads (every other setting is listed as given)."""


def read_training_args(path: Path) -> Reading:
    """``TrainingArguments`` (or TRL's config) fields from a JSON or YAML file, through HfArgumentParser."""
    raw = _load_mapping(path)
    reading = Reading("training_args", str(path), "", flatten(raw))
    args = _parse_args(raw, reading)
    reading.loader = f"{_version('transformers')} HfArgumentParser({reading.cls}).parse_dict"
    if reading.cls != "TrainingArguments":
        reading.loader += f" ({_version('trl')})"
    for name in ARGUMENT_FIELDS:
        if hasattr(args, name):
            reading.effective[name] = plain(getattr(args, name))
    return reading


@contextlib.contextmanager
def _as_adapter_dir(path: Path) -> Iterator[Path]:
    """A directory whose ``adapter_config.json`` is the file given (PeftConfig.from_pretrained reads a directory)."""
    if path.is_dir() or path.name == "adapter_config.json":
        yield path if path.is_dir() else path.parent
        return
    tmp = Path(tempfile.mkdtemp(prefix="fsdp-matrix-check-"))
    try:
        shutil.copyfile(path, tmp / "adapter_config.json")
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def read_peft(path: Path) -> Reading:
    """``adapter_config.json`` (or a directory holding one) through ``PeftConfig.from_pretrained``."""
    from peft import PeftConfig

    file = path / "adapter_config.json" if path.is_dir() else path
    raw = _load_mapping(file)
    reading = Reading("peft", str(path), f"{_version('peft')} PeftConfig.from_pretrained", flatten(raw))
    with _quiet(reading.notes), _as_adapter_dir(path) as folder:
        try:
            config = PeftConfig.from_pretrained(str(folder))
        except (TypeError, ValueError, KeyError, OSError) as exc:
            raise ReadError(f"{path}: {_version('peft')} refuses it: {exc}") from None
    reading.cls = type(config).__name__
    reading.effective = {k: plain(v) for k, v in config.to_dict().items()}
    return reading


def read_bnb(path: Path) -> Reading:
    """A ``BitsAndBytesConfig`` (its dict, or a model config holding ``quantization_config``) through
    ``BitsAndBytesConfig.from_dict``; keys it does not use are named."""
    from transformers import BitsAndBytesConfig

    raw = _load_mapping(path)
    raw = raw.get("quantization_config", raw) if isinstance(raw.get("quantization_config"), dict) else raw
    reading = Reading("bnb", str(path), f"{_version('transformers')} BitsAndBytesConfig.from_dict", flatten(raw))
    with _quiet(reading.notes):
        try:
            config, unused = BitsAndBytesConfig.from_dict(dict(raw), return_unused_kwargs=True)
        except (TypeError, ValueError) as exc:
            raise ReadError(f"{path}: {_version('transformers')} refuses it: {exc}") from None
    reading.cls = type(config).__name__
    reading.notes += [f"{k}: not used by {_version('transformers')}'s BitsAndBytesConfig" for k in unused]
    reading.effective = {k: plain(v) for k, v in config.to_dict().items()}
    return reading


READERS: Dict[str, Callable[[Path], Reading]] = {
    "accelerate": read_accelerate,
    "training_args": read_training_args,
    "peft": read_peft,
    "bnb": read_bnb,
}


def read_all(files: Dict[str, Path]) -> List[Reading]:
    """Each file given (kind -> path), read by its library, in KINDS order."""
    out = []
    for kind in KINDS:
        if kind in files:
            if not Path(files[kind]).exists():
                raise ReadError(f"{files[kind]}: no such file or directory")
            reading = READERS[kind](Path(files[kind]))
            reading.versions = installed_versions(READ_PACKAGES)
            out.append(reading)
    return out


def main(argv: Optional[List[str]] = None) -> int:
    """``python -m fsdp_matrix.check.read KIND=PATH ...``: the readings as one JSON object, in this env."""
    argv = list(sys.argv[1:] if argv is None else argv)
    files = dict(a.split("=", 1) for a in argv if "=" in a)
    try:
        readings = read_all({k: Path(v) for k, v in files.items()})
    except ReadError as exc:
        print(json.dumps({"error": str(exc)}))
        return 2
    print(json.dumps({"readings": [r.to_json() for r in readings]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
