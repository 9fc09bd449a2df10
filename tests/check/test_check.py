"""``python -m fsdp_matrix check`` end to end: PEFT's own FSDP QLoRA example on peft 0.13.2 and on a newer release, an
FSDP2 config on a release that fixed what it used to meet, a DeepSpeed config, typos, and the evidence of records.

The files are read with the libraries installed here (``where.combo_env`` is patched to find no other env), so that
each answer is the same on every machine; the tests that need a newer reader use the combo's env where one is built.
"""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest

from fsdp_matrix import cli
from fsdp_matrix.check import where
from fsdp_matrix.check.answer import CheckAnswer
from fsdp_matrix.check.setup import COVERED, _name
from fsdp_matrix.history.db import SCHEMA
from fsdp_matrix.installed import installed_versions
from fsdp_matrix.matrix import load_matrix

HERE = Path(__file__).resolve().parent
QLORA = HERE / "peft_qlora"
CONFIGS = HERE / "configs"
MATRIX = load_matrix(None, check_repros=False)


def pins(combo: str) -> str:
    return ",".join(f"{k}={v}" for k, v in MATRIX.combo(combo).pins.model_dump().items() if v)


def qlora_files(training_args: str = "training_args.yaml") -> List[str]:
    return [
        "--accelerate-config", str(QLORA / "fsdp_config_qlora.yaml"), "--training-args", str(QLORA / training_args),
        "--peft", str(QLORA / "adapter_config.json"), "--bnb", str(QLORA / "bnb.json"),
    ]  # fmt: skip


@pytest.fixture
def here_only(monkeypatch):
    """Read with the installed libraries whatever envs are built."""
    monkeypatch.setattr(where, "combo_env", lambda matrix, wanted: None)


def check(argv: List[str], capsys) -> Tuple[int, Optional[Dict], str, str]:
    status = cli.main(["check", *argv, "--json"])
    out, err = capsys.readouterr()
    return status, (json.loads(out) if out.strip() else None), out, err


def applied(answer: Dict) -> Dict[str, Dict]:
    return {c["case"]: c for c in answer["cases"] if c["status"] == "applies"}


def failing(case: Dict) -> List[Dict]:
    return [e for e in case["expectations"] if e["kind"] in ("error", "hang")]


def test_peft_qlora_example_on_peft_0_13_2_names_its_cases_and_what_works(here_only, capsys):
    status, answer, _, _ = check([*qlora_files(), "--versions", pins("old")], capsys)
    assert status == 1
    hits = applied(answer)
    assert set(hits) == {"trl-qlora-upcast", "fsdp1-mp-optimizer-dtype"}
    assert answer["axes"]["adapter"] == ["qlora"] and answer["axes"]["orig"] == ["0"]
    assert answer["axes"]["storage"] == ["bf16"] and answer["entry"] == "trl"
    for case in hits.values():
        (rule,) = failing(case)
        assert rule["evidence"] == "rules" and rule["fixed"]
        # no later release fixes it, but the rule leaves trl 0.23.0 out, where the same cells train
        assert rule["fixed"].endswith("the same cells train on trl 0.23.0 (the rule leaves it out)")
        # what works: the same QLoRA cells with use_orig_params=True, expected to train on these versions
        assert [w["change"] for w in rule["workarounds"]] == ["orig=1"]
        assert all("qlora" in cell for w in rule["workarounds"] for cell in w["examples"])
    assert hits["fsdp1-mp-optimizer-dtype"]["expectations"][0]["reproduces"] == "trl !=0.23.0, accelerate >=0.30"


def test_peft_qlora_example_on_a_newer_release(here_only, capsys):
    status, answer, _, _ = check([*qlora_files("training_args_newer.yaml"), "--versions", pins("current")], capsys)
    assert status == 1
    hits = applied(answer)
    assert set(hits) == {"trl-qlora-upcast", "fsdp1-mp-optimizer-dtype"}
    upcast = failing(hits["trl-qlora-upcast"])[0]
    # on the newer release the same QLoRA cells also train under FSDP2
    assert {w["change"] for w in upcast["workarounds"]} == {"orig=1", "wrap=fsdp2"}
    assert answer["versions"]["peft"] == "0.21.2"
    if installed_versions(["accelerate"])["accelerate"] != "1.15.0":
        assert "read with the installed libraries" in answer["read"] and "not accelerate 1.15.0" in answer["read"]


def _reader_for(combo: str) -> bool:
    """The files can be read with this combo's libraries: they are installed here, or its env is built."""
    wanted = MATRIX.combo(combo).pins.model_dump()
    here = installed_versions(where.READ_PACKAGES)
    return all(here[p] == wanted.get(p) for p in where.READ_PACKAGES) or where.combo_env(MATRIX, wanted) is not None


_skip_without_current_reader = pytest.mark.skipif(
    not _reader_for("current"),
    reason="reading with accelerate 1.15 / transformers 5.23 needs the current combo's env: "
    "nox -s 'tests(current)' runs these in it (-m current_combo)",
)


def needs_current_reader(test):
    """Skipped in the old combo's env before the current one is built (a fresh clone); never skipped for good:
    ``nox -s 'tests(current)'`` runs the tests marked ``current_combo`` in the current combo's own env."""
    return pytest.mark.current_combo(_skip_without_current_reader(test))


@needs_current_reader
def test_a_release_that_dropped_a_field_refuses_it_in_its_own_words(capsys):
    status, answer, out, err = check([*qlora_files(), "--versions", pins("current")], capsys)
    assert status == 2 and answer is None
    *progress, line = err.splitlines()  # the reading in the combo's env says what it waits for
    assert all(p.startswith("check: read") for p in progress)
    assert (
        line.startswith("fsdp_matrix check: ") and "transformers 5.23.0 refuses it" in line and "warmup_ratio" in line
    )


@needs_current_reader
def test_fsdp2_config_on_a_release_with_the_fixes_names_nothing(capsys):
    argv = ["--accelerate-config", str(CONFIGS / "fsdp2_qlora_t4.yaml"), "--peft", str(CONFIGS / "lora_q_v.json")]
    status, answer, _, _ = check([*argv, "--versions", pins("current")], capsys)
    assert status == 0, applied(answer)
    assert answer["axes"]["wrap"] == ["fsdp2"] and not applied(answer)
    assert "accelerate 1.15.0" in answer["read"]


def test_fsdp2_config_read_by_an_accelerate_without_fsdp2_says_so(here_only, capsys):
    if installed_versions(["accelerate"])["accelerate"] != "1.1.1":
        pytest.skip("the old combo's accelerate 1.1.1 reads this one (nox -s 'tests(old)')")
    argv = ["--accelerate-config", str(CONFIGS / "fsdp2_qlora_t4.yaml"), "--peft", str(CONFIGS / "lora_q_v.json")]
    status, answer, _, _ = check([*argv, "--versions", pins("old")], capsys)
    notes = answer["files"][0]["notes"]
    assert any(n.startswith("fsdp_config.fsdp_version: not an option of accelerate 1.1.1's launcher") for n in notes)
    assert answer["axes"]["wrap"] == ["decoder_layer"]  # what that launcher exports: FSDP1


def test_deepspeed_config_is_out_of_scope(here_only, capsys):
    status = cli.main(["check", "--accelerate-config", str(CONFIGS / "deepspeed_zero3.yaml")])
    out = capsys.readouterr().out
    assert status == 3
    assert out.splitlines()[-1] == (
        "out of scope: a DeepSpeed config: out of scope (every case of the matrix is PEFT under PyTorch FSDP)"
    )


def test_a_typo_is_refused_in_the_librarys_words(here_only, tmp_path, capsys):
    config = tmp_path / "acc.yaml"
    config.write_text((QLORA / "fsdp_config_qlora.yaml").read_text().replace("num_machines:", "num_machine:"))
    status, _, _, err = check(["--accelerate-config", str(config)], capsys)
    assert status == 2 and "had unknown keys (['num_machine'])" in err and len(err.splitlines()) == 1
    args = tmp_path / "args.yaml"
    args.write_text("gradient_accumulation_step: 4\nmax_grad_norm: 1.0\n")
    status, _, _, err = check(["--training-args", str(args)], capsys)
    assert status == 2 and "gradient_accumulation_step" in err and "not used by the HfArgumentParser" in err


def test_every_setting_is_mapped_or_listed(here_only, capsys):
    _, answer, _, _ = check([*qlora_files(), "--versions", pins("old")], capsys)
    listed = {item.split("=", 1)[0] for key in ("not_covered", "other_settings", "plumbing") for item in answer[key]}
    files = [QLORA / "fsdp_config_qlora.yaml", QLORA / "training_args.yaml", QLORA / "adapter_config.json"]
    import yaml

    for path in files:
        for key, value in yaml.safe_load(path.read_text()).items():
            names = [f"{key}.{k}" for k in value] if isinstance(value, dict) and value else [key]
            for name in names:
                assert _name(name) in COVERED or name in listed, f"{path.name}: {name} neither mapped nor listed"
    assert "fsdp_config.fsdp_offload_params=True" in answer["not_covered"]


def test_the_json_is_the_pydantic_model_with_a_schema_version(here_only, capsys):
    _, answer, _, _ = check([*qlora_files(), "--versions", pins("old")], capsys)
    assert answer["schema_version"] == 2
    assert CheckAnswer.model_validate(answer).exit_status == 1
    assert "schema_version" in CheckAnswer.model_json_schema()["properties"]


def _history(path: Path, combo: str, case: str, cell: str, verdict: str) -> None:
    versions = json.dumps(MATRIX.combo(combo).pins.model_dump(), sort_keys=True)
    with closing(sqlite3.connect(path)) as db:
        db.executescript(SCHEMA)
        db.execute("INSERT INTO nights VALUES ('n1', 1.0, 1.0, 'test', '[]')")
        db.execute("INSERT INTO combos VALUES ('n1', ?, ?, '{}')", (combo, versions))
        db.execute(
            "INSERT INTO cells (night, combo, case_id, cell, verdict) VALUES ('n1', ?, ?, ?, ?)",
            (combo, case, cell, verdict),
        )
        db.commit()


def test_records_of_the_same_versions_make_the_evidence_observed(here_only, tmp_path, capsys):
    db = tmp_path / "history.sqlite"
    cell = "qlora-bf16-orig0-decoder_layer-llama-entry_trl-storage_bf16-trainer_sft-ws2"
    _history(db, "old", "trl-qlora-upcast", cell, "reproduced")
    _, answer, _, _ = check([*qlora_files(), "--versions", pins("old"), "--history", str(db)], capsys)
    (rule,) = failing(applied(answer)["trl-qlora-upcast"])
    assert rule["evidence"] == "observed"
    assert rule["evidence_line"] == "observed on your versions (combo old): reproduced 1 of 1 cell(s)"
    other = failing(applied(answer)["fsdp1-mp-optimizer-dtype"])[0]
    assert other["evidence"] == "rules"  # no record of that case's cells


def test_no_file_is_bad_input(capsys):
    assert cli.main(["check"]) == 2
    assert "give at least one file" in capsys.readouterr().err


def test_records_of_the_nearest_combo_make_the_evidence_nearest_combo(here_only, tmp_path, capsys):
    db = tmp_path / "history.sqlite"
    cell = "qlora-bf16-orig0-decoder_layer-llama-entry_trl-storage_bf16-trainer_sft-ws2"
    _history(db, "old", "trl-qlora-upcast", cell, "reproduced")
    # torch 2.5.1 and bitsandbytes 0.44.1 with the old combo's peft/transformers/accelerate/trl: no record on
    # these versions, the old combo is the nearest
    _, answer, _, _ = check([*qlora_files(), "--versions", pins("torch2.5"), "--history", str(db)], capsys)
    assert answer["nearest_combo"] == "old"
    (rule,) = failing(applied(answer)["trl-qlora-upcast"])
    assert (rule["evidence"], rule["evidence_line"]) == (
        "nearest-combo",
        "observed on combo old: reproduced 1 of 1 cell(s)",
    )
