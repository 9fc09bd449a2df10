"""Between cells: a stray child that exits on its own while being cleaned up is not the rank's death."""

from __future__ import annotations

import gc
import subprocess

import psutil
import pytest

from fsdp_matrix.runner import hygiene


@pytest.fixture
def rank_hygiene():
    h = hygiene.Hygiene()
    yield h
    gc.unfreeze()  # Hygiene freezes what is alive (a rank's imports); this test process is not a rank


def test_child_that_exits_before_it_is_killed_is_reported_not_fatal(rank_hygiene, monkeypatch):
    """``child.kill()`` raised NoSuchProcess for a child that had already exited, and the rank exited 1."""
    child = subprocess.Popen(["sleep", "30"])
    gone = psutil.Process(child.pid)
    child.kill()
    child.wait()  # reaped: the psutil handle now names a process that no longer exists

    class _Me:
        def children(self, recursive=False):
            return [gone]

    real = psutil.Process
    monkeypatch.setattr(psutil, "Process", lambda *a: _Me() if not a else real(*a))
    state = rank_hygiene.check(barrier_timeout_s=1)
    assert any("child processes left running" in p for p in state["problems"])


HOSTILE_SAMPLE = ["patch_adamw", "warn_error"]
"""One change the ranks must restart after, and one the worker undoes itself."""


# nox -s heavy: tests/test_chaos.py's hostile test runs these two (and every other kind) in `nox -s tests`
@pytest.mark.heavy
def test_a_cell_that_leaves_global_state_changed_never_taints_the_next(tmp_path):
    """A monkeypatched ``torch.optim.AdamW.step`` or ``warnings.simplefilter("error")`` (and
    sys.path, anomaly mode, matmul precision, os.environ, cwd) left by one cell could flip the next healthy cell. The
    next cell must run in a process without the change, and the changing cell's record says the ranks restarted."""
    from tests.runner.hostile import run_sequence

    # every kind of left-behind state (HOSTILE_STATE) runs through `python -m fsdp_matrix run` in the hostile test
    # of tests/test_chaos.py; here each one more would only cost another restart of both ranks
    faults = [f for hostile in HOSTILE_SAMPLE for f in (hostile, "probe")]
    recs = run_sequence(tmp_path, faults)
    probes = [(prev, r) for prev, f, r in zip(faults, faults[1:], recs[1:]) if f == "probe"]
    assert [(prev, r.verdict) for prev, r in probes] == [(prev, "fix-holds") for prev, _ in probes], [
        r.line for _, r in probes
    ]
    for fault, rec in zip(faults, recs):
        if fault == "warn_error":
            # the worker records each cell's warnings inside catch_warnings, which puts the filters back as they
            # were: the change never outlives the cell, so the ranks need no restart (the probe after it passes)
            assert rec.observed.note == "", rec.observed.note
        elif fault != "probe":
            assert "global state changed by the cell" in rec.observed.note, (fault, rec.observed.note)
            assert "ranks restarted before the next cell" in rec.observed.note, (fault, rec.observed.note)


def test_torchs_own_lazy_decoration_is_no_change_but_a_cells_patch_is():
    # the first AdamW hooks AdamW.step and pulls in dynamo, which wraps torch.manual_seed: torch working as designed
    # (taken for a patch, it restarted the ranks after every cell that trains); a cell's own replacement still counts
    import torch

    from fsdp_matrix.runner import hygiene

    before = hygiene.public_attributes()
    param = torch.nn.Parameter(torch.zeros(2))
    torch.optim.AdamW([param]).step()
    assert hygiene._attribute_changes(before, hygiene.public_attributes()) == []
    saved = torch.optim.AdamW.__dict__.get("step")
    try:
        torch.optim.AdamW.step = lambda self, closure=None: None
        assert hygiene._attribute_changes(before, hygiene.public_attributes()) == ["torch.optim.AdamW.step"]
    finally:
        if saved is None:
            del torch.optim.AdamW.step
        else:
            torch.optim.AdamW.step = saved


def test_a_librarys_own_first_use_additions_are_no_change_but_a_cells_are():
    # transformers >= 4.56 sets torch.nn.Module.smart_apply the first time it initialises weights: taken for a
    # patch, every cell restarted its ranks (181 of 233 cells on peft0.17-tf4.56, 15 s each, CI 31 min). The
    # same name added from a cell's own code is still a patch.
    from pathlib import Path

    import torch

    before = hygiene.public_attributes()
    library_file = str(Path(torch.__file__).parent / "nn" / "modules" / "module.py")
    ns: dict = {}
    exec(compile("def smart_apply(self, fn):\n    return self\n", library_file, "exec"), ns)
    try:
        torch.nn.Module.smart_apply = ns["smart_apply"]
        assert hygiene._attribute_changes(before, hygiene.public_attributes()) == []
        torch.nn.Module.smart_apply = lambda self, fn: self
        assert hygiene._attribute_changes(before, hygiene.public_attributes()) == ["torch.nn.Module.smart_apply"]
    finally:
        del torch.nn.Module.smart_apply


def test_a_lazy_module_swapped_for_a_fresh_one_is_no_change_unless_a_name_resolves_elsewhere(monkeypatch):
    # transformers 4.46 replaces sys.modules["transformers"] with a fresh lazy module when the Trainer is first
    # imported: its vars hold none of the resolved names, yet each resolves to the same object (13 Trainer cells
    # on the old combo restarted their ranks for it)
    import sys
    import types

    import torch  # noqa: F401 - imports torch.optim, the module this test swaps

    real = sys.modules["torch.optim"]
    before = hygiene.public_attributes()

    class Lazy(types.ModuleType):
        def __init__(self, name, resolve):
            super().__init__(name)
            self._resolve = resolve

        def __getattr__(self, name):
            return self._resolve(name)

    def same(name):
        value = getattr(real, name)
        if isinstance(value, types.ModuleType):
            raise AttributeError(name)  # a submodule not re-exported: still the one in sys.modules
        return value

    monkeypatch.setitem(sys.modules, "torch.optim", Lazy("torch.optim", same))
    assert hygiene._attribute_changes(before, hygiene.public_attributes()) == []

    def elsewhere(name):
        if name == "SGD":
            return type("SGD", (), {})
        return getattr(real, name)

    monkeypatch.setitem(sys.modules, "torch.optim", Lazy("torch.optim", elsewhere))
    changed = hygiene._attribute_changes(before, hygiene.public_attributes())
    assert "torch.optim.SGD" in changed and all(c.startswith("torch.optim.SGD") for c in changed), changed


def _state_changes(h: hygiene.Hygiene) -> list:
    """What ``check`` calls global state changed (this test process has no process group: that problem is not
    this test's)."""
    problems = h.check(barrier_timeout_s=1)["problems"]
    said = [p for p in problems if p.startswith("global state changed by the cell: ")]
    return said[0].removeprefix("global state changed by the cell: ").split(", ") if said else []


@pytest.mark.parametrize(
    "module,owner,name",
    [
        ("peft.tuners.lora.layer", "Linear", "forward"),  # what workaround repros patch
        ("transformers.models.llama.modeling_llama", "LlamaMLP", "forward"),
        ("torch.distributed.fsdp._flat_param", "FlatParamHandle", "_validate_tensors_to_flatten"),
        ("torch.nn.modules.linear", None, "F"),  # not a callable of its own: a module alias, not watched
    ],
)
def test_a_patched_method_of_any_imported_library_class_is_a_change(rank_hygiene, module, owner, name):
    """A repro that patched ``peft.tuners.lora.layer.Linear.forward`` turned the next healthy cells into
    REGRESSION with no hygiene note: only the top-level names of nine modules were watched."""
    import importlib

    mod = importlib.import_module(module)
    target = getattr(mod, owner) if owner else mod
    rank_hygiene.check(barrier_timeout_s=1)  # the imports above are first use, not a change
    saved = vars(target)[name]
    try:
        setattr(target, name, lambda *a, **k: None)
        expected = [f"{module}.{owner}.{name}"] if owner else []
        assert _state_changes(rank_hygiene) == expected
    finally:
        setattr(target, name, saved)


def test_training_a_lora_model_with_adamw_changes_no_callable(rank_hygiene):
    """torch hooks an optimizer's step, wraps functions lazily and peft/transformers cache on first use: none of
    that is a cell's patch (taken for one, every cell would restart its ranks)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    def train():
        config = LlamaConfig(
            hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, vocab_size=50
        )
        model = get_peft_model(LlamaForCausalLM(config), LoraConfig(target_modules=["q_proj", "v_proj"]))
        optim = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
        ids = torch.randint(0, 50, (2, 8))
        model(input_ids=ids, labels=ids).loss.backward()
        optim.step()

    train()  # first use: imports and lazy set-ups
    rank_hygiene.check(barrier_timeout_s=1)
    train()
    assert _state_changes(rank_hygiene) == []


def test_a_librarys_registry_replacing_its_own_members_is_no_change_but_a_cells_replacement_is():
    # the first optimizer step imports torch._dynamo, whose CacheArtifactFactory.register replaces properties of
    # torch.compiler._cache.CacheInfo with lambdas from the same file: taken for a patch, every launch of cells that
    # import nothing else restarted its ranks after the first cell. A fresh interpreter: this one may hold dynamo.
    import subprocess
    import sys

    code = (
        "import torch\n"
        "from torch.compiler import _cache\n"
        "from fsdp_matrix.runner.hygiene import Callables\n"
        "watch = Callables()\n"
        "import torch._dynamo\n"
        "assert watch.changes() == [], watch.changes()\n"
        "_cache.CacheInfo.pgo_artifacts = property(lambda self: [])\n"
        "print(watch.changes())\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "torch.compiler._cache.CacheInfo.pgo_artifacts" in proc.stdout, proc.stdout
