"""The readings mapped onto the matrix's axes: what the libraries resolved (the variables accelerate's launcher and
``TrainingArguments`` export, the fields PEFT's and transformers' config classes hold) becomes the axis values a cell
can match. A setting that maps to no axis is listed as not covered; a DeepSpeed config, or one without FSDP, is out
of the matrix's scope; an axis no file says anything about stays unknown (every value of it is considered, and a rule
that needs one says so).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from fsdp_matrix.check.read import Reading

DEFAULTS: Dict[str, Any] = {
    "shard": "full", "init": "full", "accum": 1, "clip": "none", "compile": "none", "gc": "none", "mts": "none",
    "mp": "none", "entry": "own", "layer_cls": "name", "ac": "none",
}  # fmt: skip
"""The value a cell has on an axis it does not name, where the axis's meaning says (matrix.yaml ``axes:``): no
``shard`` is FULL_SHARD, no ``entry`` is the repro wrapping the model itself, no ``init`` is every rank building the
weights... An axis without a default here (``orig`` on FSDP2 cells) puts no condition on a cell that lacks it."""

ENTRY_CHAIN = {
    "trl": ["trl", "trainer", "accelerate", "own"],
    "trainer": ["trainer", "accelerate", "own"],
    "accelerate": ["accelerate", "own"],
    "own": ["own"],
}
"""The entries a user's entry goes through, nearest first: TRL's trainers are the Trainer underneath, which prepares
through accelerate. A case is matched at the nearest entry it runs."""

COVERED = {
    "distributed_type", "num_processes", "num_machines", "use_cpu", "mixed_precision", "fsdp_version", "version",
    "auto_wrap_policy", "use_orig_params", "cpu_ram_efficient_loading", "sync_module_states", "sharding_strategy",
    "reshard_after_forward", "state_dict_type", "activation_checkpointing", "transformer_layer_cls_to_wrap",
    "dynamo_backend", "use_regional_compilation", "gradient_accumulation_steps", "max_grad_norm", "torch_compile",
    "torch_compile_backend", "gradient_checkpointing", "use_reentrant", "bf16", "fp16", "fsdp", "peft_type",
    "use_dora", "modules_to_save", "trainable_token_indices", "target_parameters", "load_in_4bit", "load_in_8bit",
    "bnb_4bit_quant_storage", "parallelism_config_dp_replicate_size",
}  # fmt: skip
"""Settings (by their name without section and ``fsdp_`` prefix) that some axis takes: every other one is listed."""
PLUMBING = {
    "compute_environment", "debug", "machine_rank", "main_process_ip", "main_process_port", "main_training_function",
    "rdzv_backend", "same_network", "tpu_env", "tpu_use_cluster", "tpu_use_sudo", "enable_cpu_affinity", "gpu_ids",
    "output_dir",
}  # fmt: skip
"""Where and how processes start, not what they train: listed apart from the settings no case covers."""
WRAP = {
    ("TRANSFORMER_BASED_WRAP", 1): ["decoder_layer"], ("TRANSFORMER_BASED_WRAP", 2): ["fsdp2"],
    ("NO_WRAP", 1): ["root", "root_only"], ("NO_WRAP", 2): ["fsdp2_root"],
    (None, 1): ["root", "root_only"], (None, 2): ["fsdp2_root"],
}  # fmt: skip
"""(auto-wrap policy, FSDP version) -> ``wrap`` values; SIZE_BASED_WRAP has none (no case shards by size)."""
SHARDING = {"FULL_SHARD": "full", "1": "full", "SHARD_GRAD_OP": "grad_op", "2": "grad_op", "NO_SHARD": "none",
            "3": "none", "HYBRID_SHARD": "hybrid", "4": "hybrid"}  # fmt: skip
"""FSDP1 sharding strategies (by name, or the number accelerate exports) -> ``shard``; _HYBRID_SHARD_ZERO2 has none."""
TRL_TRAINERS = {"SFTConfig": "sft", "DPOConfig": "dpo"}
"""TRL config class -> the ``trainer`` axis (the TRL trainer the case builds)."""
ASSUMED = {"fix": "none", "workaround": "none"}
"""Case axes that name a workaround applied in the script: a config does not apply one, so none is assumed
(``--set fix=VALUE`` says otherwise)."""
MODELS = {"Llama": "llama", "Gemma": "gemma", "GptOss": "moe"}
"""Decoder layer class prefixes -> the tiny model a case builds of that family."""


@dataclass
class Setup:
    """A user's setup in the matrix's words."""

    values: Dict[str, List[Any]] = field(default_factory=dict)
    """Axis -> the values the setup has (empty: a value no case covers). An axis not here is unknown."""
    how: Dict[str, str] = field(default_factory=dict)
    """Axis -> the settings it was taken from."""
    entry: str = "own"
    """``trl``, ``trainer``, ``accelerate`` (from which files were given, or ``--set entry=``)."""
    world_size: int = 2
    """Processes over all machines (``num_processes``)."""
    nodes: int = 1
    """Machines (``num_machines``)."""
    device: str = "cuda"
    """``cpu`` when the config says ``use_cpu``, else ``cuda``."""
    uncovered: List[str] = field(default_factory=list)
    """``setting=value`` of the FSDP / PEFT / quantization settings no axis takes."""
    other: List[str] = field(default_factory=list)
    """``setting=value`` of the other settings no axis takes (optimizer, logging...)."""
    plumbing: List[str] = field(default_factory=list)
    """Process-start settings (addresses, ranks, TPU flags)."""
    notes: List[str] = field(default_factory=list)
    """What the mapping noticed: a setting the library did not read as written, an assumed default."""
    out_of_scope: Optional[str] = None
    """Why no case can answer (DeepSpeed, no FSDP), or None."""
    facts: Dict[str, Any] = field(default_factory=dict)
    """PEFT settings some cases need beyond the axes (``modules_to_save``, ``trainable_token_indices``)."""

    def put(self, axis: str, values: List[Any], how: str) -> None:
        self.values[axis] = values
        self.how[axis] = how


def _name(setting: str) -> str:
    last = setting.rsplit(".", 1)[-1]
    return last[5:] if last.startswith("fsdp_") and last != "fsdp_config" else last


def _truthy(value: Any) -> Optional[bool]:
    if value is None:
        return None
    return str(value).strip().lower() in ("true", "1", "yes")


def _by_kind(readings: List[Reading]) -> Dict[str, Reading]:
    return {r.kind: r for r in readings}


def _env(readings: List[Reading]) -> Dict[str, str]:
    """What accelerate reads: the launcher's variables, then the Trainer's (its ``__post_init__`` sets them later)."""
    out: Dict[str, str] = {}
    for kind in ("accelerate", "training_args"):
        for r in readings:
            if r.kind == kind:
                out.update({k[4:]: str(v) for k, v in r.effective.items() if k.startswith("env.")})
    return out


def _scope(by: Dict[str, Reading], env: Dict[str, str]) -> Optional[str]:
    acc, ta = by.get("accelerate"), by.get("training_args")
    distributed = acc.effective.get("distributed_type") if acc else None
    if distributed == "DEEPSPEED" or (ta and ta.settings.get("deepspeed")):
        return "a DeepSpeed config: out of scope (every case of the matrix is PEFT under PyTorch FSDP)"
    if env.get("ACCELERATE_USE_FSDP") == "true":
        return None
    if distributed and distributed != "FSDP":
        return f"distributed_type {distributed}, not FSDP: out of scope (every case of the matrix is under FSDP)"
    if ta and not acc and not ta.effective.get("fsdp"):
        return "these TrainingArguments set no fsdp: out of scope (every case of the matrix is under FSDP)"
    return None


def _version(env: Dict[str, str]) -> int:
    return 2 if env.get("FSDP_VERSION") == "2" else 1


def map_fsdp(setup: Setup, env: Dict[str, str]) -> None:
    """wrap, orig, init, shard, sdt, gc (accelerate's activation checkpointing), mp, model, layer_cls: from the
    variables accelerate reads."""
    version = _version(env)
    policy = env.get("FSDP_AUTO_WRAP_POLICY")
    setup.put("wrap", WRAP.get((policy, version), []), f"FSDP{version}, auto_wrap_policy {policy or 'none'}")
    if version == 1:
        orig = _truthy(env.get("FSDP_USE_ORIG_PARAMS"))
        setup.put("orig", [int(bool(orig))], f"FSDP_USE_ORIG_PARAMS={env.get('FSDP_USE_ORIG_PARAMS')}")
        strategy = env.get("FSDP_SHARDING_STRATEGY", "FULL_SHARD")
        setup.put("shard", [SHARDING[strategy]] if strategy in SHARDING else [], f"sharding_strategy {strategy}")
    else:
        reshard = _truthy(env.get("FSDP_RESHARD_AFTER_FORWARD", "true"))
        setup.put("shard", ["full" if reshard else "grad_op"], f"reshard_after_forward {reshard}")
    ram = _truthy(env.get("FSDP_CPU_RAM_EFFICIENT_LOADING"))
    setup.put("init", ["ram_efficient", "launcher"] if ram else ["full"], f"cpu_ram_efficient_loading {bool(ram)}")
    sdt = {"FULL_STATE_DICT": "full", "SHARDED_STATE_DICT": "sharded"}
    if env.get("FSDP_STATE_DICT_TYPE"):
        kind = env["FSDP_STATE_DICT_TYPE"]
        setup.put("sdt", [sdt[kind]] if kind in sdt else [], f"state_dict_type {kind}")
    if _truthy(env.get("FSDP_ACTIVATION_CHECKPOINTING")):
        setup.put("gc", ["torch_ac"], "fsdp activation_checkpointing true (torch's checkpoint_wrapper)")
        setup.put("ac", ["fsdp"], "fsdp activation_checkpointing true (accelerate's checkpoint_wrapper)")
    mixed = env.get("ACCELERATE_MIXED_PRECISION", "no")
    # the mp axis is bf16 mixed precision as the entry sets it (FSDP1 and FSDP2): fp16 or fp8 is a value no case covers
    mp = {"bf16": ["bf16"], "no": ["none"]}.get(mixed, [])
    setup.put("mp", mp, f"mixed_precision {mixed}")
    setup.put("layer_cls", ["name"], "the layer class given by name (as accelerate config writes it)")
    layer = (env.get("FSDP_TRANSFORMER_CLS_TO_WRAP") or "").split(",")[0].strip()
    family = next((m for prefix, m in MODELS.items() if layer.startswith(prefix)), None)
    if family:
        setup.put("model", [family], f"transformer_layer_cls_to_wrap {layer}")
    compile_ = env.get("ACCELERATE_DYNAMO_BACKEND", "NO")
    if compile_.upper() not in ("NO", ""):
        regional = _truthy(env.get("ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION"))
        setup.put("compile", ["regional" if regional else "whole"], f"dynamo_backend {compile_}")
    elif "ACCELERATE_DYNAMO_BACKEND" in env:
        setup.put("compile", ["none"], "dynamo_backend NO")


def map_training(setup: Setup, ta: Reading) -> None:
    """accum, clip, compile, gc, ac: the Trainer's resolved fields."""
    eff = ta.effective
    steps = int(eff.get("gradient_accumulation_steps") or 1)
    setup.put("accum", [2 if steps > 1 else 1], f"gradient_accumulation_steps {steps}")
    norm = float(eff.get("max_grad_norm") or 0)
    setup.put("clip", [1.0 if norm > 0 else "none"], f"max_grad_norm {norm:g}")
    if eff.get("bf16") or eff.get("fp16"):  # the Trainer's mixed precision (the mp axis through the Trainer)
        setup.put(
            "mp",
            ["bf16"] if eff.get("bf16") else [],
            f"{'bf16' if eff.get('bf16') else 'fp16'} true (the Trainer's mixed precision)",
        )
    if eff.get("torch_compile"):
        setup.put("compile", ["whole"], "torch_compile true")
    elif "compile" not in setup.values:
        setup.put("compile", ["none"], "torch_compile false")
    if eff.get("gradient_checkpointing"):
        kwargs = eff.get("gradient_checkpointing_kwargs") or {}
        reentrant = kwargs.get("use_reentrant", True)
        gc = "hf_reentrant" if reentrant else "hf_nonreentrant"
        how = f"gradient_checkpointing true, use_reentrant {reentrant}"
        if "use_reentrant" not in kwargs:
            how += " (transformers' default when gradient_checkpointing_kwargs names none)"
        setup.put("gc", sorted(set(setup.values.get("gc", [])) | {gc}), how)
        # the ac axis spells transformers' checkpointing the same way (and accelerate's as fsdp)
        setup.put("ac", sorted(set(setup.values.get("ac", [])) | {gc}), how)
    elif "gc" not in setup.values:
        setup.put("gc", ["none"], "gradient_checkpointing false")
    if "ac" not in setup.values:
        setup.put("ac", ["none"], "gradient_checkpointing false, no fsdp activation_checkpointing")


def map_adapter(setup: Setup, peft: Optional[Reading], bnb: Optional[Reading]) -> None:
    """adapter, storage, dtype (of a 4-bit base), mts: PEFT's and bitsandbytes' resolved configs."""
    quant = bnb.effective if bnb else {}
    four = bool(quant.get("load_in_4bit"))
    if quant.get("load_in_8bit"):
        setup.put("adapter", [], "load_in_8bit (no case quantizes to 8 bits)")
    if four:
        storage = str(quant.get("bnb_4bit_quant_storage") or "uint8")
        named = {"uint8": "uint8", "bfloat16": "bf16"}
        setup.put("storage", [named[storage]] if storage in named else [], f"bnb_4bit_quant_storage {storage}")
        half = {"bfloat16": "bf16", "float16": "fp16"}.get(storage)
        if half:  # PEFT's FSDP QLoRA recipe loads the model in the storage dtype (examples/sft/utils.py)
            setup.put("dtype", [half], f"the 4-bit base loaded in its quant storage dtype {storage}")
    if peft is None:
        if four:
            setup.put("adapter", ["qlora", "qdora"], "load_in_4bit, no adapter config given")
        return
    conf = peft.effective
    kind = str(conf.get("peft_type") or "")
    if kind == "LORA":
        dora = bool(conf.get("use_dora"))
        value = ("qdora" if dora else "qlora") if four else ("dora" if dora else "lora")
        value = "lora_params" if conf.get("target_parameters") and not conf.get("target_modules") else value
        setup.put("adapter", [value], f"peft_type LORA, use_dora {dora}" + (", load_in_4bit" if four else ""))
    elif kind == "PROMPT_TUNING":
        setup.put("adapter", ["prompt"], "peft_type PROMPT_TUNING")
    else:
        setup.put("adapter", [], f"peft_type {kind} (no case trains it)")
    saved = conf.get("modules_to_save") or []
    setup.put(
        "mts", ["none"] if not saved else (["lm_head"] if saved == ["lm_head"] else []), f"modules_to_save {saved}"
    )
    setup.facts = {"modules_to_save": saved, "trainable_token_indices": conf.get("trainable_token_indices")}


def _entry(by: Dict[str, Reading]) -> Tuple[str, str]:
    ta = by.get("training_args")
    if ta is not None and ta.cls != "TrainingArguments":
        return "trl", f"TRL's {ta.cls} reads the training arguments"
    if ta is not None:
        return "trainer", "TrainingArguments: the Trainer"
    if "accelerate" in by:
        return "accelerate", "an accelerate config, no training arguments: the script prepares through accelerate"
    return "own", "no launcher config: the script wraps the model itself"


def _layout(setup: Setup, by: Dict[str, Reading]) -> None:
    acc = by.get("accelerate")
    if acc is not None:
        procs = int(acc.effective.get("num_processes") or -1)
        setup.world_size = procs if procs > 0 else setup.world_size
        setup.nodes = int(acc.effective.get("num_machines") or 1)
        setup.device = "cpu" if acc.effective.get("use_cpu") else "cuda"
    ta = by.get("training_args")
    if ta is not None and ta.effective.get("use_cpu"):
        setup.device = "cpu"
    replicate = int((acc.settings if acc else {}).get("parallelism_config.parallelism_config_dp_replicate_size") or 1)
    if replicate > 1:
        setup.put("shard", ["hybrid"], f"parallelism_config dp_replicate_size {replicate}")


def _unread(setup: Setup, by: Dict[str, Reading], env: Dict[str, str]) -> None:
    """A TrainingArguments fsdp_config flag whose exported variable says otherwise: the release did not read it
    as written (transformers 4.46 strips the ``fsdp_`` prefix only from a fsdp_config given as a file path)."""
    ta = by.get("training_args")
    if ta is None:
        return
    for setting, value in ta.settings.items():
        if not setting.startswith("fsdp_config.") or not isinstance(value, bool):
            continue
        variable = "FSDP_" + _name(setting).upper()
        if variable in env and _truthy(env[variable]) != value:
            setup.notes.append(
                f"{setting}={value}, but {ta.loader.split(' HfArgumentParser')[0]} exports {variable}={env[variable]} "
                "(it does not read the key as written): the check goes by what it exports"
            )


def _listed(setup: Setup, readings: List[Reading]) -> None:
    """Every setting no axis takes, so that nothing is dropped unseen."""
    for r in readings:
        for setting, value in r.settings.items():
            name = _name(setting)
            if name in COVERED:
                continue
            shown = f"{setting}={value}"
            if name in PLUMBING:
                setup.plumbing.append(shown)
            elif r.kind in ("peft", "bnb") or "fsdp" in setting or setting.startswith(("deepspeed", "parallelism")):
                setup.uncovered.append(shown)
            else:
                setup.other.append(shown)


def build(readings: List[Reading], overrides: Optional[Dict[str, Any]] = None) -> Setup:
    """The setup the readings describe; ``overrides`` (``--set axis=value``) replace what the files give or add
    what no file says (the model's dtype, PEFT's wrap policy set by the script)."""
    by = _by_kind(readings)
    setup = Setup()
    env = _env(readings)
    setup.out_of_scope = _scope(by, env)
    setup.entry, setup.how["entry"] = _entry(by)
    trainer = TRL_TRAINERS.get(by["training_args"].cls) if "training_args" in by else None
    if trainer:
        setup.put("trainer", [trainer], f"TRL's {by['training_args'].cls}")
    _layout(setup, by)
    if env.get("ACCELERATE_USE_FSDP") == "true":
        map_fsdp(setup, env)
    if "training_args" in by:
        map_training(setup, by["training_args"])
    map_adapter(setup, by.get("peft"), by.get("bnb"))
    _unread(setup, by, env)
    _listed(setup, readings)
    for axis, value in ASSUMED.items():
        setup.put(axis, [value], "assumed: the script applies no workaround of a case (--set to say otherwise)")
    for axis, value in (overrides or {}).items():
        if axis == "entry":
            setup.entry, setup.how["entry"] = str(value), "--set"
        elif axis in ("world_size", "nodes"):
            setattr(setup, axis, int(value))
        else:
            setup.put(axis, [value], "--set")
    return setup
