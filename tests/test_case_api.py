"""The stable case API (README "The stable case API") as code: ``fsdp_matrix.case`` and its exact surface.

A name may be added to the facade (add it here too); removing or renaming one breaks users' repros and must fail.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import fsdp_matrix.case as case

ROOT = Path(__file__).resolve().parents[1]

HOME = {
    "train_unsharded": "fsdp_matrix.workload.generation",
    "greedy_generate": "fsdp_matrix.workload.generation",
    "check_same_tokens": "fsdp_matrix.workload.generation",
    "trainer_train_and_check": "fsdp_matrix.workload.hf_trainer",
    "trainer_entry": "fsdp_matrix.workload.hf_trainer",
    "DTYPES": "fsdp_matrix.workload.models",
    "MODELS": "fsdp_matrix.workload.recipe",
    "WRAPS": "fsdp_matrix.workload.wrapping",
    "axis": "fsdp_matrix.workload.params",
    "flag": "fsdp_matrix.workload.params",
    "UnknownAxisValue": "fsdp_matrix.workload.params",
    "RankContext": "fsdp_matrix.workload.context",
    "main": "fsdp_matrix.standalone",
    "CheckFailed": "fsdp_matrix.errors",
    "peft_model": "fsdp_matrix.workload.recipe",
    "wrap_and_train": "fsdp_matrix.workload.recipe",
    "base_dtype_name": "fsdp_matrix.workload.recipe",
    "base_model": "fsdp_matrix.workload.recipe",
    "wrap_cell": "fsdp_matrix.workload.recipe",
    "wrap_cell_and_train": "fsdp_matrix.workload.recipe",
    "device_mesh": "fsdp_matrix.workload.wrapping",
    "caught_warnings": "fsdp_matrix.workload.checks",
    "build_model": "fsdp_matrix.workload.models",
    "build_4bit_model": "fsdp_matrix.workload.models",
    "trl_entry": "fsdp_matrix.workload.trl_trainer",
    "build_tinynet": "fsdp_matrix.workload.tinynets",
    "torch_dtype": "fsdp_matrix.workload.models",
    "decoder_layers": "fsdp_matrix.workload.models",
    "decoder_layer_class": "fsdp_matrix.workload.models",
    "linear4bit_layers": "fsdp_matrix.workload.models",
    "TINY_SHAPE": "fsdp_matrix.workload.models",
    "VOCAB": "fsdp_matrix.workload.models",
    "init_of": "fsdp_matrix.workload.meta_init",
    "build_rank0_model": "fsdp_matrix.workload.meta_init",
    "has_meta": "fsdp_matrix.workload.meta_init",
    "materialize_trainable": "fsdp_matrix.workload.meta_init",
    "count_attention_calls": "fsdp_matrix.workload.activation",
    "accelerate_launch_env": "fsdp_matrix.workload.launcher",
    "fsdp_launch_config": "fsdp_matrix.workload.launcher",
    "lora_config": "fsdp_matrix.workload.adapters",
    "add_adapter": "fsdp_matrix.workload.adapters",
    "adapter_dtypes": "fsdp_matrix.workload.adapters",
    "has_autocast_option": "fsdp_matrix.workload.adapters",
    "is_adapter": "fsdp_matrix.workload.adapters",
    "TARGET_MODULES": "fsdp_matrix.workload.adapters",
    "wrap": "fsdp_matrix.workload.wrapping",
    "fsdp1": "fsdp_matrix.workload.wrapping",
    "fsdp2": "fsdp_matrix.workload.wrapping",
    "decoder_layer_policy": "fsdp_matrix.workload.wrapping",
    "fully_shard": "fsdp_matrix.workload.wrapping",
    "DTensor": "fsdp_matrix.workload.checks",
    "accelerate_setup": "fsdp_matrix.workload.entry",
    "prepare_and_train": "fsdp_matrix.workload.entry",
    "trainer_setup": "fsdp_matrix.workload.hf_trainer",
    "train_and_check": "fsdp_matrix.workload.training",
    "trainable_names": "fsdp_matrix.workload.checks",
    "synthetic_batch": "fsdp_matrix.workload.training",
    "take_reference": "fsdp_matrix.workload.corruption",
    "wrapper_kind": "fsdp_matrix.workload.checks",
    "TrainingChecks": "fsdp_matrix.workload.checks",
    "Failures": "fsdp_matrix.workload.checks",
    "clean_name": "fsdp_matrix.workload.checks",
    "full_parameters": "fsdp_matrix.workload.checks",
    "gathered_parameters": "fsdp_matrix.workload.checks",
    "cell_dir": "fsdp_matrix.workload.checkpoint",
    "check_saved": "fsdp_matrix.workload.checkpoint",
    "full_shapes": "fsdp_matrix.workload.checkpoint",
    "fsdp1_full_state_dict": "fsdp_matrix.workload.checkpoint",
    "gathered_adapter": "fsdp_matrix.workload.checkpoint",
    "logits": "fsdp_matrix.workload.checkpoint",
    "adapter_key": "fsdp_matrix.workload.checkpoint",
    "on_every_rank": "fsdp_matrix.workload.checkpoint",
    "read_adapter_dir": "fsdp_matrix.workload.checkpoint",
    "TOLERANCE": "fsdp_matrix.workload.checkpoint",
    "HF_SAVES": "fsdp_matrix.workload.checkpoint_hf",
    "hf_roundtrip": "fsdp_matrix.workload.checkpoint_hf",
    "RAW_PATHS": "fsdp_matrix.workload.checkpoint_torch",
    "raw_roundtrip": "fsdp_matrix.workload.checkpoint_torch",
    "save_once": "fsdp_matrix.workload.models",
    "save_model_files": "fsdp_matrix.workload.models",
}
"""Every public name of the facade and the module it has always been importable from."""

DOCUMENTED_UNUSED = {
    "UnknownAxisValue", "accelerate_setup", "accelerate_launch_env", "fsdp_launch_config", "wrapper_kind",
    "has_meta"}  # fmt: skip
"""Names no repro imports today, kept because README ("The stable case API", "Add a case") or the case API page
(docs/pages/case-api.md) documents them."""


def test_all_is_pinned():
    assert sorted(case.__all__) == sorted(HOME)
    assert len(case.__all__) == len(set(case.__all__)), "a name listed twice in __all__"


@pytest.mark.parametrize("name", sorted(HOME))
def test_name_is_its_home_modules_object(name):
    assert getattr(case, name) is getattr(importlib.import_module(HOME[name]), name)


def test_star_import_gives_exactly_all():
    space: dict = {}
    exec("from fsdp_matrix.case import *", space)
    assert sorted(k for k in space if not k.startswith("__")) == sorted(HOME)


def _repro_imports():
    for path in sorted((ROOT / "repros").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "fsdp_matrix.case":
                for alias in node.names:
                    yield path.name, alias.name


def test_every_name_a_repro_imports_is_in_all():
    # a name the facade module merely holds (its own imports) is not part of the promise
    outside = sorted(f"{file}: {name}" for file, name in _repro_imports() if name not in HOME)
    assert not outside, outside


def test_every_name_in_all_is_used_by_a_repro_or_documented():
    # the facade is what repros need plus what the README documents, not a list of everything workload/ holds
    used = {name for _, name in _repro_imports()}
    assert sorted(set(HOME) - used - DOCUMENTED_UNUSED) == []
