"""``init: launcher``: how a user started with ``accelerate launch --config_file <fsdp yaml>`` loads the model.

``accelerate launch`` exports its FSDP config to every rank as environment variables (``ACCELERATE_USE_FSDP=true``,
``FSDP_CPU_RAM_EFFICIENT_LOADING``, ``FSDP_SYNC_MODULE_STATES``, ``FSDP_VERSION``, ... : ``prepare_multi_gpu_env`` in
accelerate's ``utils/launch.py``), and the user's script calls ``from_pretrained`` on every rank. transformers reads
two of them (``is_fsdp_enabled()``: a process group, ``ACCELERATE_USE_FSDP`` and ``FSDP_CPU_RAM_EFFICIENT_LOADING``)
and then decides itself what ranks > 0 hold (placeholders: meta tensors or uninitialised CPU storage, depending on
the release); FSDP brings them rank 0's weights.

``accelerate_launch_env(config)`` runs a block under exactly the variables that ``accelerate launch`` would export
for ``config`` (a dict written as the yaml of ``accelerate config``): they are computed by the installed accelerate's
own launcher code (``launch_command_parser``, ``_validate_launch_command``, ``prepare_multi_gpu_env``), so every
release exports its own set, and restored on exit. Only the block sees them: the harness's ``accelerate`` entry
treats ``ACCELERATE_USE_FSDP`` in the environment as a launched script (``Accelerator()`` with the plugin taken from
env), which a repro that only loads as a launched user does must not turn on.
"""

from __future__ import annotations

import contextlib
import os
import socket
import tempfile
from pathlib import Path
from typing import Any, Dict, Iterator, Mapping

import yaml
from torch import nn

from fsdp_matrix.workload.context import RankContext
from fsdp_matrix.workload.meta_init import has_meta
from fsdp_matrix.workload.models import _config, _dtype_kwarg, build_model, save_model_files, save_once, torch_dtype


def _free_port() -> int:
    # accelerate <= 0.33 raises ConnectionError when the config's port is taken (torchrun may hold 29500)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def fsdp_launch_config(layer_cls: str, version: int, orig: bool, world_size: int) -> Dict[str, Any]:
    """The ``accelerate config`` yaml of an FSDP user with ``fsdp_cpu_ram_efficient_loading`` (as PEFT's own
    ``examples/sft/configs/fsdp_config.yaml`` writes it): transformer-based wrap on ``layer_cls``, FSDP ``version``,
    ``use_orig_params`` ``orig`` (FSDP1), ``world_size`` processes on one machine."""
    fsdp = {
        "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "fsdp_transformer_layer_cls_to_wrap": layer_cls,
        "fsdp_cpu_ram_efficient_loading": True,
        "fsdp_sync_module_states": True,
        "fsdp_offload_params": False,
        "fsdp_use_orig_params": bool(orig),
        "fsdp_version": version,
    }
    return {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": "FSDP",
        "fsdp_config": fsdp,
        "machine_rank": 0,
        "main_training_function": "main",
        "mixed_precision": "no",
        "num_machines": 1,
        "num_processes": world_size,
        "rdzv_backend": "static",
        "same_network": True,
        "use_cpu": False,
    }


def launch_env(config: Mapping[str, Any]) -> Dict[str, str]:
    """The variables ``accelerate launch --config_file <config>`` sets or changes in its ranks' environment, as
    computed by the installed accelerate (its parser, its config-file defaults, its ``prepare_multi_gpu_env``)."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_multi_gpu_env

    with tempfile.TemporaryDirectory(prefix="fsdp-matrix-launch-") as tmp:
        path = Path(tmp) / "fsdp.yaml"
        path.write_text(yaml.safe_dump({"main_process_port": _free_port(), **dict(config)}))
        args = launch_command_parser().parse_args(["--config_file", str(path), "train.py"])
        _validate_launch_command(args)
        exported = prepare_multi_gpu_env(args)
    return {k: v for k, v in exported.items() if os.environ.get(k) != v}


@contextlib.contextmanager
def accelerate_launch_env(config: Mapping[str, Any]) -> Iterator[Dict[str, str]]:
    """Run the block under the environment ``accelerate launch --config_file <config>`` would export; yields the
    variables set. Everything is restored on exit, so code after the block (the harness's ``accelerate`` entry) sees
    the environment it had."""
    exported = launch_env(config)
    # restored by hand, not through a harness helper: workload code is inlined into exported scripts, which may only
    # import what the export can inline
    saved = {k: os.environ.get(k) for k in exported}
    os.environ.update(exported)
    try:
        yield exported
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def checkpoint_path(name: str, ctx: RankContext) -> Path:
    """The tiny model ``name``, saved once per node as ``save_pretrained`` would (collective: every rank waits)."""
    return save_once(
        ctx, f"{name}-seed{ctx.seed}-launcher", lambda p: save_model_files(build_model(name, "fp32", ctx), p)
    )


def launched_model(name: str, dtype: str, config: Mapping[str, Any], ctx: RankContext) -> nn.Module:
    """The tiny model saved once per node, then ``from_pretrained`` on every rank under ``config``'s launch
    environment: transformers' own FSDP loading path decides what ranks > 0 hold."""
    _, cls = _config(name)
    path = checkpoint_path(name, ctx)
    with accelerate_launch_env(config):
        model = cls.from_pretrained(path, **{_dtype_kwarg(): torch_dtype(dtype)})
    # placeholders stay where transformers put them: FSDP gives them storage on the device
    return model if has_meta(model) else model.to(ctx.device)


def checkpoint_model(name: str, dtype: str, ctx: RankContext) -> nn.Module:
    """The same saved checkpoint loaded plainly, outside any launch environment, on this rank alone (not
    collective: ``launched_model`` saved it): what every launched rank should hold once FSDP synced them.

    The forward check's reference for ``init: launcher`` comes from it rather than from rank 0's launched model:
    rank 0 is where a loading path that drops a weight shows (transformers 4.44.2-4.57.6 left rank 0's tied
    ``embed_tokens`` on the meta device under the launch environment, observed 2026-11-27 from a checkpoint that
    stored only ``lm_head.weight``), and a reference taken from it judges nothing."""
    _, cls = _config(name)
    path = ctx.scratch / f"{name}-seed{ctx.seed}-launcher"
    return cls.from_pretrained(path, **{_dtype_kwarg(): torch_dtype(dtype)}).to(ctx.device)
