"""``triage --json``: the same answer as the text, as one JSON object whose schema is ``triage.answer.Answer``."""

import json
from pathlib import Path

from fsdp_matrix.triage import cli as triage_cli
from fsdp_matrix.triage.answer import Answer

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "triage"


def _run(capsys, *args):
    code = triage_cli.main([*map(str, args)])
    return code, capsys.readouterr().out


def test_json_is_the_schema_and_the_same_answer_as_the_text(capsys):
    paste = FIXTURES / "accelerate2872_no_split.txt"
    code, out = _run(capsys, paste, "--versions", "peft=0.13.2", "--json")
    answer = Answer.model_validate_json(out)
    text_code, text = _run(capsys, paste, "--versions", "peft=0.13.2")
    assert code == text_code == 0
    assert answer.schema_version == 3 and answer.claims[0].case == "no-split-modules"
    assert answer.claims[0].level in ("strong", "likely", "weak")
    assert f"evidence: {answer.claims[0].level}" in text
    assert answer.claims[0].fits[0].fixed in text
    assert answer.versions == {"peft": "0.13.2"}
    assert set(json.loads(out)) == set(Answer.model_json_schema()["properties"])


def test_json_of_a_paste_that_points_elsewhere_has_no_claim_and_says_why(capsys):
    code, out = _run(capsys, FIXTURES / "corpus" / "trl600_zero3_weight2d.txt", "--json")
    answer = Answer.model_validate_json(out)
    assert code == 1 and answer.claims == [] and not answer.matched
    assert answer.similar[0].reason == "similar message, but this looks like DeepSpeed ZeRO-3, not FSDP"
    _, text = _run(capsys, FIXTURES / "corpus" / "trl600_zero3_weight2d.txt")
    assert "similar message, but this looks like DeepSpeed ZeRO-3, not FSDP" in text
