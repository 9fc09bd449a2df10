"""The stable case API: everything a repro (``repros/<name>.py``) may use, in one import.

``from fsdp_matrix.case import RankContext, peft_model, wrap_and_train`` keeps working across releases of
fsdp-matrix: the names in ``__all__`` are pinned by ``tests/test_case_api.py``, and each is the very object of its
home module (``fsdp_matrix.workload.*``, ``fsdp_matrix.errors``, ``fsdp_matrix.standalone``), so the older imports
from those modules keep working too, though only this module is advertised: every repro in ``repros/`` imports
harness code from here alone (``tests/test_repro_contract.py``). Everything else in ``fsdp_matrix`` may move.

``DTensor`` and ``fully_shard`` are torch's own classes, imported from wherever this torch release keeps them
(the path moved between 2.4 and 2.6).
"""

from __future__ import annotations

from fsdp_matrix.errors import CheckFailed
from fsdp_matrix.standalone import main
from fsdp_matrix.workload.activation import count_attention_calls
from fsdp_matrix.workload.adapters import (
    TARGET_MODULES,
    adapter_dtypes,
    add_adapter,
    has_autocast_option,
    is_adapter,
    lora_config,
)
from fsdp_matrix.workload.checkpoint import (
    TOLERANCE,
    adapter_key,
    cell_dir,
    check_saved,
    fsdp1_full_state_dict,
    full_shapes,
    gathered_adapter,
    logits,
    on_every_rank,
    read_adapter_dir,
)
from fsdp_matrix.workload.checkpoint_hf import HF_SAVES, hf_roundtrip
from fsdp_matrix.workload.checkpoint_torch import RAW_PATHS, raw_roundtrip
from fsdp_matrix.workload.checks import (
    DTensor,
    Failures,
    TrainingChecks,
    caught_warnings,
    clean_name,
    full_parameters,
    gathered_parameters,
    trainable_names,
    wrapper_kind,
)
from fsdp_matrix.workload.context import RankContext
from fsdp_matrix.workload.corruption import take_reference
from fsdp_matrix.workload.entry import accelerate_setup, prepare_and_train
from fsdp_matrix.workload.generation import check_same_tokens, greedy_generate, train_unsharded
from fsdp_matrix.workload.hf_trainer import trainer_entry, trainer_setup, trainer_train_and_check
from fsdp_matrix.workload.launcher import accelerate_launch_env, fsdp_launch_config
from fsdp_matrix.workload.meta_init import build_rank0_model, has_meta, init_of, materialize_trainable
from fsdp_matrix.workload.models import (
    DTYPES,
    TINY_SHAPE,
    VOCAB,
    build_4bit_model,
    build_model,
    decoder_layer_class,
    decoder_layers,
    linear4bit_layers,
    save_model_files,
    save_once,
    torch_dtype,
)
from fsdp_matrix.workload.params import UnknownAxisValue, axis, flag
from fsdp_matrix.workload.recipe import (
    MODELS,
    base_dtype_name,
    base_model,
    peft_model,
    wrap_and_train,
    wrap_cell,
    wrap_cell_and_train,
)
from fsdp_matrix.workload.tinynets import build_tinynet
from fsdp_matrix.workload.training import synthetic_batch, train_and_check
from fsdp_matrix.workload.trl_trainer import trl_entry
from fsdp_matrix.workload.wrapping import WRAPS, decoder_layer_policy, device_mesh, fsdp1, fsdp2, fully_shard, wrap

__all__ = [
    # the cell's context, the standalone entry point, the failure a check raises
    "RankContext",
    "main",
    "CheckFailed",
    # the recipe most cases use, and its base and wrap for a repro that builds its own adapter or trains its own way
    "peft_model",
    "wrap_and_train",
    "base_dtype_name",
    "base_model",
    "wrap_cell",
    "wrap_cell_and_train",
    # axis values, read so that an unknown one fails naming it
    "axis",
    "flag",
    "UnknownAxisValue",
    "DTYPES",
    "MODELS",
    "WRAPS",
    # models and adapters
    "build_model",
    "build_4bit_model",
    "build_tinynet",
    "torch_dtype",
    "decoder_layers",
    "count_attention_calls",
    "decoder_layer_class",
    "linear4bit_layers",
    "TINY_SHAPE",
    "VOCAB",
    # the init axis: rank 0 loads, the other ranks start on meta (meta_init.py)
    "init_of",
    "build_rank0_model",
    "has_meta",
    "materialize_trainable",
    # init: launcher: a block under the variables `accelerate launch --config_file <fsdp yaml>` exports (launcher.py)
    "accelerate_launch_env",
    "fsdp_launch_config",
    # files a node's ranks share (its scratch: written by its local rank 0)
    "save_once",
    "save_model_files",
    "lora_config",
    "add_adapter",
    "adapter_dtypes",
    "has_autocast_option",
    "is_adapter",
    "TARGET_MODULES",
    # wrapping and the entries
    "wrap",
    "fsdp1",
    "fsdp2",
    "decoder_layer_policy",
    "fully_shard",
    "device_mesh",
    "DTensor",
    "accelerate_setup",
    "prepare_and_train",
    "trainer_setup",
    "trainer_entry",
    "train_unsharded",
    "greedy_generate",
    "check_same_tokens",
    "trainer_train_and_check",
    "trl_entry",
    # training and its checks
    "train_and_check",
    "trainable_names",
    "synthetic_batch",
    "take_reference",
    "wrapper_kind",
    "TrainingChecks",
    "Failures",
    "clean_name",
    "full_parameters",
    "gathered_parameters",
    "caught_warnings",
    # checkpoints
    "cell_dir",
    "check_saved",
    "full_shapes",
    "fsdp1_full_state_dict",
    "gathered_adapter",
    "logits",
    "adapter_key",
    "on_every_rank",
    "read_adapter_dir",
    "TOLERANCE",
    "HF_SAVES",
    "hf_roundtrip",
    "RAW_PATHS",
    "raw_roundtrip",
]
