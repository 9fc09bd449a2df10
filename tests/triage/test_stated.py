"""``triage.stated`` and ``triage.works``: the versions an issue states are the ones answered on, and a claim on them
names what trains there: a setting to change or a release newer than the user's."""

import io
import json
from pathlib import Path

import pytest

from fsdp_matrix.triage import cli as triage_cli
from fsdp_matrix.triage.stated import stated_versions

FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "triage"


@pytest.mark.parametrize(
    "text,versions",
    [
        (
            "- PyTorch version (GPU?): 2.5.1+cu124 (True)\n- PEFT version: 0.15.0\n",
            {"torch": "2.5.1", "peft": "0.15.0"},
        ),
        (
            "peft==0.10.0\ntransformers-4.40.1\naccelerate 0.30.0\n",
            {"peft": "0.10.0", "transformers": "4.40.1", "accelerate": "0.30.0"},
        ),
        ("- `Accelerate` version: 0.20.3\n", {"accelerate": "0.20.3"}),
        ("peft                     0.11.2.dev0\n", {"peft": "0.11.2.dev0"}),
        # a path, a module, a range: no version stated
        ('File "/x/torch/distributed/fsdp/_flat_param.py", line 3\ntorch.distributed 2\npeft>=0.10\n', {}),
    ],
)
def test_a_paste_s_listing_of_versions_is_read(text, versions):
    assert stated_versions(text) == versions


def test_a_covered_paste_that_states_versions_is_answered_on_them_with_what_trains(capsys, monkeypatch):
    paste = FIXTURES / "peft1702_title.txt"
    text = paste.read_text() + "\npytorch version: 2.2.2\npeft version: 0.10.0\n"
    monkeypatch.setattr("sys.stdin", io.StringIO(text))
    assert triage_cli.main(["-", "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["versions_from"] == "stated in the paste"
    assert answer["versions"]["peft"] == "0.10.0" and answer["versions"]["torch"] == "2.2.2"
    claim = answer["claims"][0]
    assert claim["case"] == "lora-requires-grad"
    assert claim["what_works"] and any(w.startswith(("set ", "upgrade ")) for w in claim["what_works"])


def test_older_than_observed_what_works_comes_from_the_nearest_combo_that_has_a_setting(capsys, monkeypatch):
    """A torch older than every combo: the nearest combo (peft 0.10) lacks autocast_adapter_dtype, so its setting is
    read on the nearest combo that has one; a release the paste states that lacks the option gets none."""
    text = (
        "FSDP + LoRA in bf16 with PEFT's fp32 adapters, torch 2.2.2\n"
        "ValueError: Must flatten tensors with uniform dtype but got torch.bfloat16 and torch.float32\n"
    )
    monkeypatch.setattr("sys.stdin", io.StringIO(text))
    assert triage_cli.main(["-", "--json"]) == 0
    claim = json.loads(capsys.readouterr().out)["claims"][0]
    assert claim["case"] == "mixed-dtype"
    assert any(w.startswith("set autocast=0 (trains on the nearest combo with") for w in claim["what_works"])
    monkeypatch.setattr("sys.stdin", io.StringIO(text + "peft 0.10.0\n"))
    assert triage_cli.main(["-", "--json"]) == 0
    claim = json.loads(capsys.readouterr().out)["claims"][0]
    assert not any("autocast" in w for w in claim["what_works"])  # peft 0.10 has no autocast_adapter_dtype


def test_a_stated_trl_is_answered_on_never_told_to_upgrade_to_an_older_release(capsys, monkeypatch):
    text = (
        "QLoRA with FSDP through TRL's DPOTrainer (prepare_model_for_kbit_training), peft 0.13.2\n"
        "ValueError: Must flatten tensors with uniform dtype but got torch.bfloat16 and torch.float32\n"
    )
    monkeypatch.setattr("sys.stdin", io.StringIO(text + "trl==0.8.6\n"))
    assert triage_cli.main(["-", "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["versions"]["trl"] == "0.8.6"
    assert "upgrade trl to 0.29 or later (you have 0.8.6)" in answer["claims"][0]["what_works"]
    monkeypatch.setattr("sys.stdin", io.StringIO(text + "trl==0.30.0\n"))
    assert triage_cli.main(["-", "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert not any("upgrade trl" in w for c in answer["claims"] for w in c["what_works"])


def test_a_setting_that_fails_on_the_stated_versions_is_not_what_works(capsys, monkeypatch):
    """DoRA through the Trainer, use_orig_params=True, on peft 0.11: orig=0 trains from peft 0.12 on, but fails with
    the requires_grad error on 0.11 (a rule says so): it is not offered as the nearest combo's."""
    text = (
        "DoRA with the Trainer under FSDP1, peft 0.11.1\n"
        '  File "/x/site-packages/peft/tuners/lora/dora.py", line 3, in get_weight_norm\n'
        "    x = weight.shape[1]\n"
        "IndexError: tuple index out of range\n"
    )
    monkeypatch.setattr("sys.stdin", io.StringIO(text))
    assert triage_cli.main(["-", "--json"]) == 0
    claim = json.loads(capsys.readouterr().out)["claims"][0]
    assert claim["case"] == "dora-sharded-weight"
    assert not any(w.startswith("set orig=0") for w in claim["what_works"])
