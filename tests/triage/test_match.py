"""``triage.match`` on the corpus: real pastes from upstream threads (tests/fixtures/triage/corpus/, each with its
URL on its first line and the case it should be named as first, or ``none``).

Every paste of this corpus is asserted paste by paste and against the targets: its ``test`` half was measured once
(17/25 covered named first, 2/34 others claimed) and has been tuned on since, so the whole corpus is now material
triage is tuned on. A held-out half is built from fresh threads elsewhere and is never asserted here. Pastes of 13
threads that matrix.yaml or the older fixtures also cite are in the corpus (other comments or other parts of those
threads, not the text a rule was written from); the rest are from threads nothing else cites."""

import re
from pathlib import Path

import pytest

from fsdp_matrix.matrix import load_matrix
from fsdp_matrix.triage.match import claims, match
from fsdp_matrix.triage.parse import parse
from tests.triage.corpus import CORPUS, load

ROOT = Path(__file__).resolve().parents[2]
MATRIX = load_matrix(ROOT / "matrix.yaml", check_repros=False)
FIXTURES = load()
# the pastes of corpus/ (split version 1, both its halves), asserted paste by paste. Split version 3 also puts fresh/
# (version 2's test half) in dev, but its pastes were measured once and reported, not yet tuned on: they are left out
# of the per-paste assertions and the targets until a session tunes on them (then they join TUNED, each miss listed
# in MISSES). The held-out test half (heldout3/) is never asserted here: it is measured once, by
# python -m tests.triage.corpus --half test
TUNED = [fx for fx in FIXTURES if fx.half == "dev" and fx.folder == "corpus"]
MISSES = {
    # pastes the matcher gets wrong, each a known gap (strict: a fix must remove it from here)
    "verlpr4275_prose.txt": "prose of FSDP2 dtype mismatch errors without the message: no case's words",
    "peft1910_dora_sft_head.txt": "DoRA names two cases alike, cut before its exception line: no claim",
    "trl1723_title_prepare.txt": "one message, two cases, nothing in the paste tells them apart: both weak",
    "trl4550_grpo_title.txt": "a GRPO + FSDP2 + DTensor title: since case trl-grpo-lm-head-fp32 (GRPO, FSDP2 in its"
    " title) the words name two cases alike, so neither (generate-fsdp2 without that case, or with a trl version)",
}


def _first(matrix, text):
    found = claims(match(matrix, parse(text)))
    return (found[0].case.id, found[0].level) if found else (None, None)


@pytest.mark.parametrize(
    "fx",
    [
        pytest.param(fx, id=fx.name, marks=[pytest.mark.xfail(strict=True, reason=MISSES[fx.name])])
        if fx.name in MISSES
        else pytest.param(fx, id=fx.name)
        for fx in TUNED
    ],
)
def test_the_corpus_paste_names_its_case_first_or_nothing(fx):
    first, level = _first(MATRIX, fx.text)
    assert first == fx.expected
    assert (level in ("strong", "likely", "weak")) is (first is not None)


def test_the_corpus_meets_the_targets():
    answers = [(fx, _first(MATRIX, fx.text)) for fx in TUNED]
    covered = [(fx, first) for fx, (first, _) in answers if fx.expected]
    other = [(fx, first) for fx, (first, _) in answers if not fx.expected]
    assert len(covered) >= 40 and len(other) >= 50
    # issue 36's targets
    assert sum(a == fx.expected for fx, a in covered) >= 0.9 * len(covered)
    assert sum(a is not None for _, a in other) * 15 <= len(other)
    assert not [fx.name for fx, (first, level) in answers if level == "strong" and first != fx.expected]


def test_the_corpus_is_real_pastes_each_with_its_thread():
    cited = (ROOT / "matrix.yaml").read_text() + "".join(p.read_text() for p in CORPUS.parent.glob("*.txt"))
    for fx in TUNED:  # the held-out half is checked by tests/triage/test_corpus.py (no thread cited anywhere)
        assert re.fullmatch(r"https://github\.com/[\w.-]+/[\w.-]+/(issues|pull)/\d+", fx.url), fx.name
        assert fx.text.strip(), fx.name
        # a thread cited elsewhere may give another paste, never the same text
        assert not any(fx.text.strip() in p.read_text() for p in CORPUS.parent.glob("*.txt")), fx.name
    assert sum(fx.url in cited for fx in TUNED) <= 13


def test_deepspeed_zero3_is_not_claimed_and_says_why():
    fx = next(f for f in FIXTURES if f.name.startswith("trl600"))
    found = match(MATRIX, parse(fx.text))
    assert found and not claims(found)
    assert found[0].against == "similar message, but this looks like DeepSpeed ZeRO-3, not FSDP"


def test_context_words_break_a_tie_between_cases_with_one_message():
    fx = next(f for f in FIXTURES if f.name.startswith("axolotlpr1559"))
    assert _first(MATRIX, fx.text)[0] == "trl-qlora-upcast"
    assert _first(MATRIX, fx.text.replace("DPO Trainer", "Trainer").replace("prepare_for_kbit_training", "x"))[0] == (
        "mixed-dtype"
    )


@pytest.mark.parametrize(
    "name,case",
    [
        ("records_lora_requires_grad.txt", "lora-requires-grad"),
        ("records_dora_sharded_weight.txt", "dora-sharded-weight"),
        ("records_mixed_dtype.txt", "mixed-dtype"),
        ("records_no_split_modules.txt", "no-split-modules"),
    ],
)
def test_the_four_reports_tracebacks_from_the_records_are_claimed_first(name, case):
    text = "\n".join(line for line in (CORPUS.parent / name).read_text().splitlines() if not line.startswith("# "))
    found = claims(match(MATRIX, parse(text)))
    assert found and found[0].case.id == case and found[0].level in ("strong", "likely")


HANG_REPORT = """Timeout (0:00:10)!
Thread 0x00007f3a2b7fe640 (most recent call first):
  File "/env/lib/python3.11/site-packages/torch/distributed/fsdp/_state_dict_utils.py", line 310 in _pre_hook
  File "/env/lib/python3.11/site-packages/transformers/integrations/peft.py", line 480 in get_adapter_state_dict
  File "/env/lib/python3.11/site-packages/transformers/modeling_utils.py", line 2790 in save_pretrained
  File "/env/lib/python3.11/site-packages/transformers/trainer.py", line 3912 in save_model
  File "train.py", line 88 in main
"""
"""A rank-0-only save under FSDP1 with a PEFT adapter, as faulthandler dumps it: frames, no exception line."""


def test_a_hang_report_fits_the_hang_rule_by_its_frames():
    """triage matched only exception lines: a deadlock report with the right frames matched nothing."""
    [first, *_] = claims(match(MATRIX, parse(HANG_REPORT)))
    assert first.case.id == "save-rank0-state-dict" and first.level in ("strong", "likely")
    assert first.hits[0].signature.error.type == "hang"
    as_exception = HANG_REPORT.replace("Timeout (0:00:10)!\n", "").replace("(most recent call first)", "")
    weaker = match(MATRIX, parse(as_exception + "RuntimeError: something else\n"))
    assert all(h.points < first.hits[0].points for m in weaker for h in m.hits if h.fit == "stack")


def test_a_message_cut_where_the_paste_ends_fits_in_part_never_strong():
    frames = (
        "FSDP1 training of LoRA on MoE experts (target_parameters):\n"
        '  File "/x/site-packages/peft/tuners/lora/layer.py", line 2081, in get_delta_weight\n'
        "    weight_A = weight_A.reshape(self.num_experts, -1, weight_A.shape[-1])\n"
    )
    cut = "RuntimeError: shape '[64, -1, 1024]' is invalid for inp"
    found = claims(match(MATRIX, parse(frames + cut)))
    assert found and found[0].case.id == "moe-target-parameters" and found[0].level == "likely"
    assert found[0].hits[0].fit == "part"
    # the same words followed by more of the log were not cut: no fit
    assert not claims(match(MATRIX, parse(frames + cut + "\nrank1: exiting\n")))


FLATTEN = (
    "PEFT model under FSDP1:\n"
    '  File "/x/site-packages/torch/distributed/fsdp/_flat_param.py", line 3, in _validate_tensors_to_flatten\n'
    "    raise ValueError(\n"
    "ValueError: Must flatten tensors with uniform requires_grad when use_orig_params=False\n"
)


def test_two_cases_the_paste_shows_as_much_for_are_both_named_neither_strong():
    found = claims(match(MATRIX, parse(FLATTEN)))
    assert len(found) >= 2 and found[0].level == "likely" and found[0].tied == found[1].case.id
    assert any("same evidence" in note for note in found[0].hits[0].notes)


def test_a_case_whose_cells_never_run_the_paste_s_adapter_ranks_lower():
    lora = {m.case.id: m for m in claims(match(MATRIX, parse(FLATTEN.replace("PEFT model", "LoRA model"))))}
    dora = {m.case.id: m for m in claims(match(MATRIX, parse(FLATTEN.replace("PEFT model", "DoRA model"))))}
    # dora-sharded-weight runs DoRA only: a LoRA paste shows one point less for it, a DoRA paste does not
    assert lora["dora-sharded-weight"].hits[0].points == dora["dora-sharded-weight"].hits[0].points - 1
    assert "lora-requires-grad" not in dora or dora["lora-requires-grad"].hits[0].points < (
        dora["dora-sharded-weight"].hits[0].points
    )


def test_a_setting_of_a_case_s_title_the_paste_names_ranks_that_case():
    with_head = FLATTEN.replace("PEFT model", "PEFT model with modules_to_save=['lm_head']")
    found = claims(match(MATRIX, parse(with_head)))
    assert found[0].case.id == "modules-to-save" and found[0].tied is None
    assert any("modules_to_save" in e for e in found[0].hits[0].evidence)
    # the message's own words are not the report's: use_orig_params=False in the message ranks no case
    assert claims(match(MATRIX, parse(FLATTEN)))[0].tied
