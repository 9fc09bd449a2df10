"""LoRA and hidden sizes that do not divide by the shard group: https://github.com/pytorch/pytorch/issues/136228"""

from __future__ import annotations

import torch
from peft import get_peft_model
from torch import distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy
from transformers import LlamaConfig, LlamaForCausalLM

from fsdp_matrix.case import (
    TINY_SHAPE,
    Failures,
    RankContext,
    axis,
    cell_dir,
    decoder_layer_policy,
    decoder_layers,
    flag,
    fully_shard,
    lora_config,
    main,
    save_model_files,
    save_once,
    synthetic_batch,
    take_reference,
    train_and_check,
    trainable_names,
)

CASE = "uneven-shards"
HIDDEN = {42: dict(hidden_size=42, intermediate_size=90, num_attention_heads=3, num_key_value_heads=3)}
"""The ``hidden`` axis: a tiny Llama whose hidden (42), intermediate (90) and head sizes do not divide by 4."""


def _base(params: dict, ctx: RankContext, seed: int) -> torch.nn.Module:
    """The tiny model as users load one: saved once per node (its local rank 0 writes its own scratch), then
    ``from_pretrained`` on every rank."""
    shape = {**TINY_SHAPE, **HIDDEN[axis(params, "hidden", tuple(HIDDEN))]}

    def save(path):
        torch.manual_seed(seed)
        save_model_files(LlamaForCausalLM(LlamaConfig(**shape)), path)

    path = save_once(ctx, "-".join([CASE, f"hidden{shape['hidden_size']}", f"seed{seed}"]), save)
    return LlamaForCausalLM.from_pretrained(path).to(ctx.device)


def _peft(params: dict, ctx: RankContext, seed: int) -> torch.nn.Module:
    r = axis(params, "r", (6,))
    base = _base(params, ctx, seed)
    torch.manual_seed(seed)
    # init_lora_weights=False: a random lora_B, so a fresh model's adapter differs from the trained one everywhere
    return get_peft_model(base, lora_config(r=r, lora_alpha=2 * r, init_lora_weights=seed == ctx.seed))


def _mesh(ctx: RankContext, hybrid: bool):
    if not hybrid:
        return init_device_mesh(ctx.device.type, (ctx.world_size,))
    per_node = ctx.local_world_size or ctx.world_size
    # explicit: on CPU FSDP1 would otherwise derive its node groups from the (GPU) device count
    return init_device_mesh(
        ctx.device.type, (ctx.world_size // per_node, per_node), mesh_dim_names=("replicate", "shard")
    )


def _wrap(model: torch.nn.Module, params: dict, ctx: RankContext, mesh) -> torch.nn.Module:
    kind = axis(params, "wrap", ("decoder_layer", "fsdp2"))
    hybrid = axis(params, "shard", ("hybrid",), default=None) == "hybrid"
    if kind == "fsdp2":
        for layer in decoder_layers(model):
            fully_shard(layer, mesh=mesh)
        return fully_shard(model, mesh=mesh)
    return FullyShardedDataParallel(
        model,
        auto_wrap_policy=decoder_layer_policy(model),
        sharding_strategy=ShardingStrategy.HYBRID_SHARD if hybrid else ShardingStrategy.FULL_SHARD,
        device_mesh=mesh,
        use_orig_params=bool(flag(params, "orig")),
        device_id=ctx.device,
    )


def _shard_group(model: torch.nn.Module, mesh, hybrid: bool) -> list:
    """The ranks this rank shards with, as the wrapper holds them."""
    if isinstance(model, FullyShardedDataParallel):
        return dist.get_process_group_ranks(model.process_group)
    return dist.get_process_group_ranks(mesh.get_group("shard") if hybrid else mesh.get_group())


def _full(model: torch.nn.Module) -> dict:
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))


def run(params: dict, ctx: RankContext) -> dict:
    """Run one cell on this rank. Let the observed error propagate; return the checks dict on success."""
    load = axis(params, "load", ("full_broadcast", "dcp"))
    hybrid = axis(params, "shard", ("hybrid",), default=None) == "hybrid"
    mesh = _mesh(ctx, hybrid)
    model = _peft(params, ctx, ctx.seed)
    trainable = trainable_names(model)
    reference = take_reference(model, synthetic_batch(ctx))
    wrapped = _wrap(model, params, ctx, mesh)
    group = _shard_group(wrapped, mesh, hybrid)
    checks = train_and_check(wrapped, ctx, trainable=trainable, reference=reference)
    per_node = ctx.local_world_size or ctx.world_size
    failed = Failures()
    if hybrid and sorted({r // per_node for r in group}) != [ctx.rank // per_node]:
        failed.append(f"rank {ctx.rank} shards with ranks {group}: not its own node's")
    if checks.get("shard_group") != len(group):
        failed.append(f"the sharding check divided by {checks.get('shard_group')}, the shard group has {len(group)}")
    trained = _full(wrapped)
    with cell_dir(ctx, params) as out:
        fresh = _wrap(_peft(params, ctx, ctx.seed + 1), params, ctx, mesh)
        if load == "full_broadcast":
            # trained holds the full state on every rank (cpu_offload=True, rank 0 only, segfaults FSDP1 on CPU)
            if ctx.is_main:
                torch.save(trained, out / "full.pt")
            dist.barrier()
            state = torch.load(out / "full.pt", weights_only=True) if ctx.is_main else {}
            options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
            set_model_state_dict(fresh, state, options=options)
        else:
            import torch.distributed.checkpoint as dcp

            dcp.save(get_model_state_dict(wrapped), checkpoint_id=str(out / "dcp"))
            state = get_model_state_dict(fresh)
            dcp.load(state, checkpoint_id=str(out / "dcp"))
            set_model_state_dict(fresh, state)
        loaded = _full(fresh)
    differ = sorted(k for k in trained if k not in loaded or not torch.equal(trained[k], loaded[k]))
    adapters = [k for k in differ if any(t in k for t in ("lora_A", "lora_B"))]
    if differ:
        failed.append(
            f"rank {ctx.rank}: after the {load} load {len(differ)}/{len(trained)} tensors differ from the trained "
            f"ones ({len(adapters)} of them LoRA), e.g. {', '.join((adapters or differ)[:3])}"
        )
    failed.raise_if_any()
    lora_a = [tuple(t.shape) for k, t in trained.items() if "lora_A" in k][:1]
    return {**checks, "shard_group_ranks": group, "lora_A_shape": lora_a, "tensors_reloaded": len(trained)}


if __name__ == "__main__":
    main(run, CASE)
