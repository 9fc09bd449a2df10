"""What a rank must look like between cells for the next cell to be unaffected by the last one."""

from __future__ import annotations

import gc
import operator
import os
import sys
import types
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from fsdp_matrix.clip import clip

# libraries export some settings on first use (torch's inductor cache dir): a cell may add those once
_FIRST_USE_ENV = ("TORCHINDUCTOR_", "TRITON_", "KMP_", "CUDA_MODULE_LOADING")


class Hygiene:
    """What a rank must look like between cells for the next cell to be unaffected by this one.

    FSDP1 keeps each flat parameter (and through it the wrapped modules) alive from C++ after the model is gone,
    so "no nn.Module left" cannot be the test: every FSDP1 cell would fail it. Leaked modules and their bytes are
    measured and reported; the launch is retired when they exceed a memory budget, and at once for what really
    leaks into the next cell: child processes, a broken process group, changed global torch state or environment.
    """

    def __init__(self, leak_budget_bytes: int = 512 << 20) -> None:
        gc.collect()
        # everything alive now (torch, transformers, peft...) is permanent: later collections and leak scans then
        # only walk what cells created, ~100x fewer objects (0.5 s -> a few ms per cell)
        gc.freeze()
        self.budget = leak_budget_bytes
        self.leaked_bytes = 0
        self.state = self._global_state()
        self.callables = Callables()

    @staticmethod
    def _global_state() -> Dict[str, Any]:
        import torch

        return {
            "default_dtype": str(torch.get_default_dtype()),
            "grad_enabled": torch.is_grad_enabled(),
            "anomaly_mode": torch.is_anomaly_enabled(),
            "deterministic": (
                torch.are_deterministic_algorithms_enabled(),
                torch.is_deterministic_algorithms_warn_only_enabled(),
                torch.backends.cudnn.deterministic,
                torch.backends.cudnn.benchmark,
            ),
            "matmul_precision": (torch.get_float32_matmul_precision(), torch.backends.cuda.matmul.allow_tf32),
            "cwd": os.getcwd(),
            "sys.path": list(sys.path),
            "environ": dict(os.environ),
            "warnings": list(warnings.filters),
            "attributes": public_attributes(),
        }

    @staticmethod
    def _leaked_modules() -> Tuple[int, int]:
        import torch

        count, size = 0, 0
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # isinstance probes deprecated torch objects, which warn
            for obj in gc.get_objects():
                if isinstance(obj, torch.nn.Module):
                    count += 1
                    size += sum(p.numel() * p.element_size() for p in obj.parameters(recurse=False))
        return count, size

    def check(self, barrier_timeout_s: float) -> Dict[str, Any]:
        import psutil
        import torch
        import torch.distributed as dist

        gc.collect()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        problems = []
        modules, size = self._leaked_modules()
        # frozen after each clean cell, so a scan sees only this cell's leftovers: the total is the running sum
        self.leaked_bytes += size
        if self.leaked_bytes > self.budget:
            problems.append(
                f"leaked modules hold {self.leaked_bytes >> 20} MiB in this launch "
                f"(budget {self.budget >> 20} MiB; this cell left {modules})"
            )
        children = psutil.Process().children(recursive=True)
        # multiprocessing's resource tracker and similar helpers are ours to keep; anything else was leaked
        stray = [c for c in children if "resource_tracker" not in " ".join(_cmdline(c))]
        if stray:
            problems.append(
                "child processes left running: "
                + ", ".join(f"{c.pid} {clip(' '.join(_cmdline(c)), 60)}" for c in stray)
            )
            for child in stray:
                try:
                    child.kill()
                except psutil.NoSuchProcess:
                    pass  # it exited on its own since it was listed: gone is what we wanted
        now = self._global_state()
        changed = [k for k in now if k not in _COMPARED_APART and self.state[k] != now[k]]
        changed += _env_changes(self.state["environ"], now["environ"])
        changed += _warning_changes(self.state["warnings"], now["warnings"])
        changed += _attribute_changes(self.state["attributes"], now["attributes"])
        changed += [c for c in self.callables.changes() if c not in changed]
        # libraries export some settings on first use (torch's inductor cache dir), and import modules and add
        # lazy attributes: the first time is accepted, and becomes part of what later cells are compared against
        env_before, env_after = self.state["environ"], now["environ"]
        self.state["environ"] = {k: v for k, v in env_after.items() if k in env_before or k.startswith(_FIRST_USE_ENV)}
        self.state["warnings"] = now["warnings"]
        self.state["attributes"] = {**now["attributes"], **self.state["attributes"]}
        if changed:
            problems.append("global state changed by the cell: " + ", ".join(changed))
        try:
            if dist.get_backend() == "gloo":
                dist.monitored_barrier(timeout=timedelta(seconds=barrier_timeout_s))
            # every rank must retire together, or the clean ones would start a cell the dirty ones never join
            flag = torch.tensor([1.0 if problems else 0.0], device="cuda" if dist.get_backend() == "nccl" else "cpu")
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            if flag.item() and not problems:
                problems.append("another rank is not clean")
        except Exception as exc:  # noqa: BLE001 - any failure here means the group is unusable
            problems.append(f"process group unusable: {type(exc).__name__}: {clip(str(exc), 300)}")
        if not problems:
            gc.freeze()  # what a clean cell left behind is measured already: stop re-scanning it every cell
        return {"clean": not problems, "problems": problems, "leaked_modules": modules, "leaked_bytes": size}


_COMPARED_APART = ("environ", "warnings", "attributes")

WATCHED_MODULES = (
    "torch",
    "torch.nn",
    "torch.nn.functional",
    "torch.optim",
    "torch.distributed",
    "peft",
    "transformers",
    "accelerate",
    "bitsandbytes",
)
"""Modules whose public top-level attributes, and their classes' methods, a cell must leave as it found them (a
workaround repro may monkeypatch on purpose; the next cell must not inherit it). Only those already imported are
looked at: importing one here would change what the cells see (transformers imports lazily)."""


def public_attributes() -> Dict[Tuple[str, ...], Any]:
    """(module, name[, method]) -> object, for the public top-level attributes of WATCHED_MODULES already imported,
    and the functions and descriptors their public classes define. Objects, not ids: an id is reused once the
    object is freed, and a replacement could then pass for the original."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # probing deprecated objects (torch.distributed.reduce_op) warns
        return _public_attributes()


def _public_attributes() -> Dict[Tuple[str, ...], Any]:
    out: Dict[Tuple[str, ...], Any] = {}
    for mod_name in WATCHED_MODULES:
        module = sys.modules.get(mod_name)
        if module is None:
            continue
        for name, value in list(vars(module).items()):
            if name.startswith("_"):
                continue
            out[(mod_name, name)] = value
            if isinstance(value, type) and getattr(value, "__module__", "").startswith(mod_name.split(".")[0]):
                for attr, member in list(vars(value).items()):
                    dunder = attr.startswith("__") and attr.endswith("__")
                    if isinstance(member, _METHODS) and (not dunder or attr in ("__init__", "__call__")):
                        if _torch_hooked_inherited(value, attr, member):
                            continue
                        out[(mod_name, name, attr)] = member
    return out


def _torch_hooked_inherited(cls: type, attr: str, member: Any) -> bool:
    """torch's own step hook on an inherited method: the first optimizer of a class sets ``Cls.step`` to a
    ``functools.wraps`` wrapper marked ``hooked`` around the base's step (Optimizer._patch_step_function), once per
    process. That is torch working as designed, not a cell's patch."""
    if not (getattr(member, "hooked", False) and hasattr(member, "__wrapped__")):
        return False
    inherited = next((vars(base)[attr] for base in cls.__mro__[1:] if attr in vars(base)), None)
    return _wraps(member, inherited) or _wraps(inherited, member.__wrapped__)


_LIBRARY_DIRS: Dict[str, str] = {}


def _library_dir(top: str) -> str:
    """The folder a watched library is installed in ("" if it is not imported)."""
    if top not in _LIBRARY_DIRS:
        module = sys.modules.get(top)
        path = getattr(module, "__file__", None)
        if not path:
            return ""  # not imported yet: look again next time rather than remember "nowhere"
        _LIBRARY_DIRS[top] = str(Path(path).parent) + os.sep
    return _LIBRARY_DIRS[top]


def _code(member: Any) -> Any:
    """The code object behind a function, method or property (its getter); None for a builtin."""
    func = getattr(member, "fget", None) or getattr(member, "__func__", None) or member
    return getattr(func, "__code__", None)


def _defined_in(member: Any, *tops: str) -> bool:
    """``member``'s code lives in the installed package of one of ``tops`` (not in a repro or the harness)."""
    code = _code(member)
    filename = code.co_filename if code is not None else ""
    return any((d := _library_dir(top)) and filename.startswith(d) for top in tops)


def _wraps(new: Any, old: Any) -> bool:
    """``new`` is a wrapper that torch's own code put around ``old`` (its ``__wrapped__`` chain reaches it): torch
    decorates some functions lazily, e.g. ``torch.manual_seed`` once dynamo is first imported, and hooks an
    optimizer class's ``step`` on first use."""
    for _ in range(8):
        if new is old:
            return True
        if not _defined_in(new, "torch") or not hasattr(new, "__wrapped__"):
            return False
        new = new.__wrapped__
    return False


_MISSING = object()


def _resolves_to(key: Tuple[str, ...], value: Any) -> bool:
    """The name still gives ``value`` when looked up as a cell would. transformers 4.46 swaps its own lazy module
    object for a fresh one when the Trainer is first imported: the new one has none of the old one's resolved names
    in ``vars`` yet, but ``getattr`` resolves each to the very same object, so nothing a cell sees has changed; a
    submodule it does not re-export is still the one in ``sys.modules``."""
    if isinstance(value, types.ModuleType) and sys.modules.get(f"{key[0]}.{key[1]}") is value:
        return True
    try:
        obj = getattr(sys.modules[key[0]], key[1])
        if len(key) == 3:
            obj = vars(obj).get(key[2], _MISSING)
    except Exception:  # noqa: BLE001 - a name that no longer resolves is a removed name
        return False
    return obj is value or _wraps(obj, value)


_METHODS = (types.FunctionType, staticmethod, classmethod, property, types.BuiltinFunctionType)


def _same_definition(new: Any, old: Any) -> bool:
    """A library replaced a member of its own with code from the same file of its own: a registry filling itself
    in on first use. Importing torch._dynamo, which the first optimizer step of a process does, makes
    torch/compiler/_cache.py's CacheArtifactFactory.register replace the properties of CacheInfo that the same file
    defines (observed 2026-11-27 with torch 2.13.0). A cell's patch has code of its own, in its repro."""
    a, b = _code(new), _code(old)
    if a is None or b is None or not _defined_in(new, *_LIBRARIES):
        return False
    return a.co_filename == b.co_filename


def _attribute_changes(before: Dict[Tuple[str, ...], Any], after: Dict[Tuple[str, ...], Any]) -> List[str]:
    """Attributes replaced or removed since ``before``, and methods added to classes it had; new top-level names
    (a lazy import's) are first use, not a change."""
    changed = [
        k
        for k, v in before.items()
        if k[0] in sys.modules
        and not (k in after and (after[k] is v or _wraps(after[k], v) or _same_definition(after[k], v)))
        and not (k not in after and _resolves_to(k, v))
    ]
    # a method added to a class that was already there (AdamW.step over Adam's) is a patch, not a lazy import;
    # unless a library's own code adds it on first use (transformers >= 4.56 sets torch.nn.Module.smart_apply the
    # first time it initialises weights: taken for a patch, it restarted the ranks after every cell, 15 s each)
    changed += [
        k
        for k in after
        if len(k) == 3 and k not in before and k[:2] in before and not _defined_in(after[k], *_LIBRARIES)
    ]
    return [".".join(k) for k in sorted(changed)][:20]


_LIBRARIES = ("torch", "transformers", "peft", "accelerate", "bitsandbytes", "trl")


def _env_changes(before: Dict[str, str], after: Dict[str, str]) -> List[str]:
    return [
        f"${k}"
        for k in sorted(set(before) | set(after))
        if before.get(k) != after.get(k) and not (k not in before and k.startswith(_FIRST_USE_ENV))
    ]


def _warning_changes(before: list, after: list) -> List[str]:
    """A filter the cell removed, or one it added that turns warnings into errors: either changes what the next
    cell raises. Libraries add ``ignore`` filters when first imported; those change no verdict and are accepted."""
    removed = [f for f in before if f not in after]
    errors = [f for f in after if f not in before and f[0] == "error"]
    if removed or errors:
        return [f"warnings filters ({len(errors)} 'error' added, {len(removed)} removed)"]
    return []


def _cmdline(proc: Any) -> list:
    try:
        return proc.cmdline()
    except Exception:  # noqa: BLE001 - the process may be gone already
        return []


_WATCHED = _METHODS + (type,)


class _Owner:
    """A module or a class of the libraries, and its callables when last looked at (the objects themselves: an id
    could be reused by a replacement once the original is freed)."""

    def __init__(self, obj: Any, label: str) -> None:
        self.obj = obj
        """The module or class."""
        self.label = label
        """``module`` or ``module.Class``: what a change is reported as, with the name appended."""
        self.snap()

    def snap(self) -> None:
        self.view = d = vars(self.obj)
        """The module's dict or the class's mappingproxy: a live view, taken once."""
        module_level = isinstance(self.obj, types.ModuleType)
        names = tuple(
            k
            for k, v in list(d.items())
            if isinstance(v, _WATCHED if module_level else _METHODS)
            and not (k.startswith("__") and k.endswith("__"))
            or k in ("__init__", "__call__")
        )
        self.values = tuple(d[k] for k in names)
        """The callables, in ``names`` order."""
        self.names = names
        """Their names."""
        self.size = len(d)
        getter = operator.itemgetter(*names) if names else None
        self.get: Optional[Callable[[Any], Any]] = getter if len(names) != 1 else (lambda m: (getter(m),))

    def same(self) -> bool:
        """Nothing was replaced, removed or added: a few C-level calls, no Python loop."""
        d = self.view
        if len(d) != self.size:
            return False
        try:
            # tuple equality tests identity first (PyObject_RichCompareBool), and functions compare by identity
            return self.get is None or self.get(d) == self.values
        except KeyError:
            return False

    def changes(self) -> List[str]:
        """The names replaced or removed, and methods added to a class from outside the libraries; torch's own lazy
        wrappers and step hooks are no change. Takes the new state as the one to compare against next."""
        d = vars(self.obj)
        out = []
        for name, old in zip(self.names, self.values):
            new = d.get(name, _MISSING)
            if (
                new is old
                or _wraps(new, old)
                or _same_definition(new, old)
                or (isinstance(self.obj, type) and _torch_hooked_inherited(self.obj, name, new))
            ):
                continue
            if new is _MISSING and isinstance(self.obj, types.ModuleType) and _resolves_to((self.label, name), old):
                continue
            out.append(f"{self.label}.{name}")
        if isinstance(self.obj, type):
            out += [
                f"{self.label}.{k}"
                for k, v in list(d.items())
                if k not in self.names
                and isinstance(v, _METHODS)
                and not k.startswith("__")
                and not _defined_in(v, *_LIBRARIES)
            ]
        self.snap()
        return out


class Callables:
    """The functions and classes of every imported module of the libraries (torch, transformers, peft, accelerate,
    trl, bitsandbytes), and the methods of every class those modules define: taken once per launch (~0.2 s), then
    compared after each cell by identity, owner by owner (C-level: an itemgetter and a tuple comparison each),
    and looked at name by name only where one differs. A module imported since is first use: taken, not compared.
    """

    def __init__(self) -> None:
        self.owners: Dict[Tuple[str, int], _Owner] = {}
        """(label, id of the module or class) -> what it held when last looked at."""
        self.modules: Dict[str, Any] = {}
        """The library modules taken so far, by name."""
        self.seen = 0
        """``len(sys.modules)`` when modules were last taken."""
        self._take_new()

    def _take_new(self) -> None:
        self.seen = len(sys.modules)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # probing deprecated objects warns
            for name, module in list(sys.modules.items()):
                if self.modules.get(name) is module or name.partition(".")[0] not in _LIBRARIES:
                    continue
                if not isinstance(module, types.ModuleType):
                    continue
                self.modules[name] = module
                self._own(module, name)
                for value in list(vars(module).values()):
                    if isinstance(value, type) and value.__module__ == name:
                        self._own(value, f"{name}.{value.__qualname__}")

    def _own(self, obj: Any, label: str) -> None:
        key = (label, id(obj))
        if key not in self.owners:
            owner = _Owner(obj, label)
            if owner.names:  # a module or class without callables has nothing a cell could patch but add to
                self.owners[key] = owner

    def changes(self) -> List[str]:
        """``module.name`` / ``module.Class.method`` of each callable a cell replaced, removed or added (at most
        20); then modules imported since are taken."""
        out: List[str] = []
        try:
            # one comprehension over live views: the per-owner method call costs more than the comparison itself
            stale = [o for o in self.owners.values() if len(o.view) != o.size or (o.get and o.get(o.view) != o.values)]
        except KeyError:  # a name removed: look at each owner on its own
            stale = [o for o in self.owners.values() if not o.same()]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for owner in stale:
                out += owner.changes()
        if len(sys.modules) != self.seen:
            self._take_new()
        return sorted(set(out))[:20]
