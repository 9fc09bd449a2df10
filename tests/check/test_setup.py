"""The mapping onto the axes and the matching of cells, on readings made up here (no library is imported): what
each exported variable or resolved field becomes, what is listed as not covered, and which cells a setup is."""

from __future__ import annotations

from typing import Any, Dict

from fsdp_matrix.cells import Cell
from fsdp_matrix.check.match import case_entry, cell_matches, match_case
from fsdp_matrix.check.needs import FACTS, NEEDS
from fsdp_matrix.check.read import Reading
from fsdp_matrix.check.setup import build
from fsdp_matrix.matrix import load_matrix

MATRIX = load_matrix(None, check_repros=False)
OLD = MATRIX.combo("old").pins.model_dump()


def accelerate(env: Dict[str, str], **settings: Any) -> Reading:
    eff = {"distributed_type": "FSDP", "num_processes": 8, "num_machines": 1, "use_cpu": False}
    eff.update({f"env.{k}": v for k, v in {"ACCELERATE_USE_FSDP": "true", **env}.items()})
    return Reading("accelerate", "a.yaml", "", settings, eff, cls="ClusterConfig")


def peft(**conf: Any) -> Reading:
    return Reading("peft", "adapter_config.json", "", dict(conf), {"peft_type": "LORA", **conf}, cls="LoraConfig")


def test_fsdp2_variables_map_to_fsdp2_axes():
    env = {"FSDP_VERSION": "2", "FSDP_AUTO_WRAP_POLICY": "TRANSFORMER_BASED_WRAP",
           "FSDP_RESHARD_AFTER_FORWARD": "false", "FSDP_CPU_RAM_EFFICIENT_LOADING": "true"}  # fmt: skip
    s = build([accelerate(env)])
    assert s.values["wrap"] == ["fsdp2"] and "orig" not in s.values
    assert s.values["shard"] == ["grad_op"] and s.values["init"] == ["ram_efficient", "launcher"]
    assert (s.entry, s.world_size, s.device) == ("accelerate", 8, "cuda")


def test_fsdp1_variables_and_what_no_case_covers():
    env = {"FSDP_AUTO_WRAP_POLICY": "SIZE_BASED_WRAP", "FSDP_USE_ORIG_PARAMS": "false",
           "FSDP_SHARDING_STRATEGY": "SHARD_GRAD_OP", "ACCELERATE_MIXED_PRECISION": "fp16"}  # fmt: skip
    s = build([accelerate(env, **{"fsdp_config.fsdp_offload_params": True, "machine_rank": 0, "seed": 1})])
    assert s.values["wrap"] == [] and s.values["orig"] == [0] and s.values["shard"] == ["grad_op"]
    assert s.values["mp"] == []  # fp16 mixed precision: no case covers it
    assert s.uncovered == ["fsdp_config.fsdp_offload_params=True"]
    assert s.plumbing == ["machine_rank=0"] and s.other == ["seed=1"]


def test_adapters():
    bnb = Reading("bnb", "b.json", "", {}, {"load_in_4bit": True, "bnb_4bit_quant_storage": "bfloat16"})
    assert build([peft(use_dora=True), bnb]).values["adapter"] == ["qdora"]
    four = build([peft(), bnb])
    assert (
        four.values["adapter"] == ["qlora"] and four.values["storage"] == ["bf16"] and four.values["dtype"] == ["bf16"]
    )
    assert build([peft(target_parameters=["experts.w"])]).values["adapter"] == ["lora_params"]
    ia3 = Reading("peft", "a.json", "", {}, {"peft_type": "IA3"})
    assert build([ia3]).values["adapter"] == []
    assert build([peft(modules_to_save=["lm_head"])]).values["mts"] == ["lm_head"]


def test_deepspeed_and_ddp_are_out_of_scope():
    ds = Reading("accelerate", "a.yaml", "", {}, {"distributed_type": "DEEPSPEED"})
    assert "DeepSpeed" in build([ds]).out_of_scope
    ddp = Reading("accelerate", "a.yaml", "", {}, {"distributed_type": "MULTI_GPU"})
    assert "MULTI_GPU" in build([ddp]).out_of_scope


def test_training_arguments_fields():
    fields = {"gradient_accumulation_steps": 4, "max_grad_norm": 0.0, "torch_compile": True,
              "gradient_checkpointing": True, "fsdp": ["full_shard"]}  # fmt: skip
    ta = Reading("training_args", "t.yaml", "", {}, fields, cls="DPOConfig")
    s = build([accelerate({"FSDP_AUTO_WRAP_POLICY": "TRANSFORMER_BASED_WRAP"}), ta])
    assert s.values["accum"] == [2] and s.values["clip"] == ["none"] and s.values["compile"] == ["whole"]
    assert s.values["gc"] == ["hf_reentrant"] and s.entry == "trl" and s.values["trainer"] == ["dpo"]
    assert s.values["ac"] == ["hf_reentrant"]


def test_activation_checkpointing_maps_to_the_ac_axis():
    fsdp_ac = build(
        [accelerate({"FSDP_AUTO_WRAP_POLICY": "TRANSFORMER_BASED_WRAP", "FSDP_ACTIVATION_CHECKPOINTING": "true"})]
    )
    assert fsdp_ac.values["ac"] == ["fsdp"] and fsdp_ac.values["gc"] == ["torch_ac"]
    fields = {"gradient_checkpointing": True, "gradient_checkpointing_kwargs": {"use_reentrant": False}}
    ta = Reading("training_args", "t.yaml", "", {}, fields, cls="TrainingArguments")
    assert build([accelerate({}), ta]).values["ac"] == ["hf_nonreentrant"]
    off = Reading("training_args", "t.yaml", "", {}, {"gradient_checkpointing": False}, cls="TrainingArguments")
    assert build([accelerate({}), off]).values["ac"] == ["none"]
    on = Cell("ac-entries", (("ac", "fsdp"), ("adapter", "lora"), ("orig", 0), ("wrap", "decoder_layer")))
    assert cell_matches(on, fsdp_ac, {"ac"}, "accelerate")
    assert not cell_matches(on, build([accelerate({}), off]), {"ac"}, "accelerate")
    # a cell of a case that varies ac and names none is ac none: not the setup of a user who checkpoints
    bare = Cell("x", (("adapter", "lora"), ("orig", 0), ("wrap", "decoder_layer")))
    assert not cell_matches(bare, fsdp_ac, {"ac"}, "accelerate") and cell_matches(bare, fsdp_ac, set(), "accelerate")


def test_a_cell_takes_its_default_on_an_axis_its_case_varies():
    s = build([accelerate({"FSDP_AUTO_WRAP_POLICY": "TRANSFORMER_BASED_WRAP", "FSDP_SHARDING_STRATEGY": "SHARD_GRAD_OP",
                           "FSDP_USE_ORIG_PARAMS": "true"}), peft(use_dora=True)])  # fmt: skip
    plain = Cell("x", (("adapter", "dora"), ("orig", 1), ("wrap", "decoder_layer")))
    assert not cell_matches(plain, s, {"adapter", "orig", "wrap", "shard"}, "own")  # no shard: FULL_SHARD
    assert cell_matches(plain, s, {"adapter", "orig", "wrap"}, "own")  # the case never varies shard
    assert cell_matches(Cell("x", plain.params + (("shard", "grad_op"),)), s, {"shard"}, "own")


def test_the_entry_is_matched_at_the_nearest_one_the_case_runs():
    assert case_entry(MATRIX.case("lora-requires-grad"), "trl") == "trl"
    assert case_entry(MATRIX.case("fsdp2-qlora-accelerate"), "trl") == "accelerate"
    assert case_entry(MATRIX.case("no-split-modules"), "accelerate") == "own"


def test_without_an_adapter_config_a_lora_failure_is_only_conditional():
    env = {"FSDP_AUTO_WRAP_POLICY": "TRANSFORMER_BASED_WRAP", "FSDP_USE_ORIG_PARAMS": "false"}
    declared = {name: list(axis.values) for name, axis in MATRIX.axes.items()}
    found = match_case(MATRIX.case("lora-requires-grad"), build([accelerate(env)]), OLD, declared)
    failing = [h for h in found.rules if h.expected.kind == "error"]
    # the rule is known for LoRA in fp32 and bf16: conditions on the adapter and the dtype the files did not give
    assert failing and all(h.conditions == {"adapter": ["lora"], "dtype": ["bf16", "fp32"]} for h in failing)
    with_lora = match_case(MATRIX.case("lora-requires-grad"), build([accelerate(env), peft()]), OLD, declared)
    assert [h.conditions for h in with_lora.rules if h.expected.kind == "error"] == [{"dtype": ["bf16", "fp32"]}]
    s = build([accelerate(env), peft()], {"dtype": "fp32"})
    assert [h.conditions for h in match_case(MATRIX.case("lora-requires-grad"), s, OLD, declared).rules
            if h.expected.kind == "error"] == [{}]  # fmt: skip


def test_needs_names_cases_of_the_matrix():
    ids = {c.id for c in MATRIX.cases}
    assert set(NEEDS) <= ids and set(FACTS) <= ids
