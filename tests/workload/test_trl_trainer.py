"""The ``trl`` entry (fsdp_matrix/workload/trl_trainer.py): the tiny tokenizer and dataset, the option names per TRL
release, and real 2-rank cells through TRL's SFTTrainer (scratch_trl.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("trl", reason="the env pins no trl (matrix.yaml: trl is an optional pin)")

from fsdp_matrix.workload import trl_trainer  # noqa: E402
from fsdp_matrix.workload.models import VOCAB  # noqa: E402
from fsdp_matrix.workload.training import SEQ  # noqa: E402
from tests.workload.support import rank_outcomes, run_two_ranks  # noqa: E402


def test_tokenizer_maps_text_to_the_tiny_models_ids():
    tok = trl_trainer.tiny_tokenizer()
    assert len(tok) == VOCAB
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)
    assert tok("t3 t127 t64", add_special_tokens=False)["input_ids"] == [3, 127, 64]


def test_datasets_are_the_same_for_a_seed_and_shaped_per_trainer():
    sft = trl_trainer.tiny_dataset("sft", 4, seed=7)
    assert sft.column_names == ["text"] and len(sft) == 4
    assert sft["text"] == trl_trainer.tiny_dataset("sft", 4, seed=7)["text"]
    assert all(len(t.split()) == SEQ for t in sft["text"])
    dpo = trl_trainer.tiny_dataset("dpo", 3, seed=7)
    assert sorted(dpo.column_names) == ["chosen", "prompt", "rejected"] and len(dpo) == 3
    grpo = trl_trainer.tiny_dataset("grpo", 5, seed=7)
    assert grpo.column_names == ["prompt"] and len(grpo) == 5
    assert all(len(p.split()) == SEQ // 2 for p in grpo["prompt"])


def test_grpo_reward_tells_completions_apart():
    # GRPO's advantages are the rewards less their group's mean: equal rewards would give zero gradients
    assert trl_trainer.token_sum_reward(["t3 t4", "t100"]) == [7 / VOCAB, 100 / VOCAB]
    assert trl_trainer.token_sum_reward([[{"role": "assistant", "content": "t5 x"}]]) == [5 / VOCAB]


def test_options_go_under_the_name_each_release_has():
    options = {"max_length": 64, "dataset_text_field": "text"}
    # TRL >= 0.16: SFTConfig.max_length; 0.9-0.15: SFTConfig.max_seq_length; 0.8: SFTTrainer(max_seq_length=...)
    assert trl_trainer._place(options, {"max_length", "dataset_text_field"}, set()) == (options, {})
    assert trl_trainer._place(options, {"max_seq_length", "dataset_text_field"}, set())[0] == {
        "max_seq_length": 64,
        "dataset_text_field": "text",
    }
    assert trl_trainer._place(options, set(), {"max_seq_length", "dataset_text_field"}) == (
        {},
        {"max_seq_length": 64, "dataset_text_field": "text"},
    )


def test_an_unknown_trainer_is_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown TRL trainer 'ppo'"):
        with trl_trainer.trl_setup(None, None, {}, None, trainer="ppo"):
            pass


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    out = tmp_path_factory.mktemp("trl")
    proc = run_two_ranks(Path(__file__).with_name("scratch_trl.py"), str(out))
    return rank_outcomes(proc, out)


@pytest.mark.heavy  # a 2-rank run of TRL's SFTTrainer; the entry_trl cells run in nox -s tests
def test_sft_with_peft_config_trains_under_fsdp1_and_passes_every_check(outcomes):
    for rank in outcomes:
        got = rank["fsdp1"]
        assert got["status"] == "ok", got
        checks = got["checks"]
        assert (checks["entry"], checks["trl_trainer"], checks["wrapper"]) == ("trl", "SFTTrainer", "fsdp1")
        assert checks["global_step"] == 3 and checks["steps"] == 3
        # TRL applied the LoraConfig itself: 2 layers x q/v x lora_A/lora_B, every one trained
        assert checks["trainable_tensors"] == checks["trainable_changed"] == checks["trainable_with_grad"] == 8
        assert checks["frozen_changed"] == [] and checks["frozen_compared"] > 0
        assert checks["forward_max_diff"] <= checks["forward_tol"][1]
        assert any(line.startswith("(C)") for line in checks["shim"])
    assert outcomes[0]["fsdp1"]["checks"]["losses"] == outcomes[1]["fsdp1"]["checks"]["losses"]


@pytest.mark.heavy  # a 2-rank run of TRL's SFTTrainer; the entry_trl cells run in nox -s tests
def test_a_model_that_is_not_fsdp_fails_the_cell(outcomes):
    for rank in outcomes:
        got = rank["no_shim"]
        assert got["status"] == "CheckFailed", got
        assert "not FSDP1" in got["message"]


@pytest.mark.heavy  # a 2-rank run of TRL's SFTTrainer; the entry_trl cells run in nox -s tests
def test_fp32_master_weights_under_mixed_precision_are_promised_in_fp32(outcomes):
    for rank in outcomes:
        got = rank["bf16_mp"]
        assert got["status"] == "ok", got
        checks = got["checks"]
        assert checks["wrapper"] == "fsdp1" and checks["plugin"]["use_orig_params"] is True
        if checks["adapter_dtypes"] == ["torch.bfloat16"]:
            # TRL left the adapters in bf16: accelerate upcast all 8 when it wrapped them (mixed precision bf16)
            assert checks["master_fp32"] == 8
            assert checks["bytes_per_rank"]["float32"] and checks["bytes_promised"]["float32"]
        else:  # PEFT already upcast them (autocast_adapter_dtype): nothing for accelerate to upcast
            assert checks["adapter_dtypes"] == ["torch.float32"] and "master_fp32" not in checks
