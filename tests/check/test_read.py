"""The readers: each file goes through its library's own loader, and what the library refuses, warns or drops is
said in its words. Bad input is one line and exit 2, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from fsdp_matrix.check.read import ReadError, read_accelerate, read_bnb, read_peft, read_training_args
from tests.argfuzz import assert_one_line_error

QLORA = Path(__file__).resolve().parent / "peft_qlora"


def test_the_accelerate_reading_is_what_the_launcher_exports():
    r = read_accelerate(QLORA / "fsdp_config_qlora.yaml")
    assert r.cls == "ClusterConfig" and r.effective["distributed_type"] == "FSDP"
    assert r.effective["env.FSDP_USE_ORIG_PARAMS"] == "false"
    assert r.effective["env.FSDP_AUTO_WRAP_POLICY"] == "TRANSFORMER_BASED_WRAP"
    assert r.settings["fsdp_config.fsdp_offload_params"] is True  # every setting kept, flattened


def test_a_fsdp_config_key_that_is_no_launcher_option_is_named(tmp_path):
    config = tmp_path / "a.yaml"
    config.write_text(
        (QLORA / "fsdp_config_qlora.yaml").read_text().replace("fsdp_config:\n", "fsdp_config:\n  fsdp_bogus: 1\n")
    )
    notes = read_accelerate(config).notes
    assert any(n.startswith("fsdp_config.fsdp_bogus: not an option of accelerate ") for n in notes)


def test_training_arguments_with_trl_fields_are_read_by_trls_config():
    pytest.importorskip("trl")
    r = read_training_args(QLORA / "training_args.yaml")
    assert r.cls == "SFTConfig"
    assert r.effective["gradient_accumulation_steps"] == 2 and r.effective["max_grad_norm"] == 1.0
    assert r.effective["gradient_checkpointing_kwargs"] == {"use_reentrant": True}


def test_a_peft_typo_is_refused_or_warned_by_peft(tmp_path):
    config = tmp_path / "adapter_config.json"
    config.write_text('{"peft_type": "LORA", "r": 8, "lora_alpah": 16, "target_modules": ["q_proj"]}')
    try:
        reading = read_peft(config)
    except ReadError as exc:  # peft before check_kwargs: LoraConfig.__init__ refuses the keyword
        assert "lora_alpah" in str(exc)
    else:  # newer peft warns that it ignores it
        assert any("lora_alpah" in n for n in reading.notes)


def test_a_bnb_key_transformers_does_not_use_is_named(tmp_path):
    config = tmp_path / "bnb.json"
    config.write_text('{"load_in_4bit": true, "bnb_4bit_quant_storge": "bfloat16"}')
    r = read_bnb(config)
    assert r.effective["load_in_4bit"] is True and r.effective["bnb_4bit_quant_storage"] == "uint8"
    assert any("bnb_4bit_quant_storge" in n for n in r.notes)


@pytest.mark.parametrize(
    "argv",
    [
        ["--peft", "{missing}"],
        ["--accelerate-config", "{dir}"],
        ["--accelerate-config", "{garbage}"],
        ["--training-args", "{list}"],
        ["--bnb", "{garbage}"],
        ["--peft", "{adapter}", "--versions", "torch=abc"],
        ["--peft", "{adapter}", "--set", "bogus=1"],
        ["--peft", "{adapter}", "--set", "novalue"],
        ["--peft", "{adapter}", "--history", "{garbage}"],
        ["--peft", "{adapter}", "--results", "{missing}"],
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, argv):
    (tmp_path / "adir").mkdir()
    (tmp_path / "garbage.yaml").write_text("a: [1, 2\nb: {")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    paths = {"missing": tmp_path / "nope.json", "dir": tmp_path / "adir", "garbage": tmp_path / "garbage.yaml",
             "list": tmp_path / "list.yaml", "adapter": QLORA / "adapter_config.json"}  # fmt: skip
    line = assert_one_line_error(["check", *[a.format(**paths) for a in argv]])
    assert line.startswith("fsdp_matrix check")
