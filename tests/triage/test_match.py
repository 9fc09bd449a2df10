"""``triage.match`` on the dev half of the corpus: real pastes from upstream threads (tests/fixtures/triage/corpus/ and
fresh/, each with its URL on its first line and the case it should be named as first, or ``none``), and split
version 3's spent held-out half (heldout3/, measured once at 5/16 and reported, tuned on since).

Every dev paste is asserted paste by paste: corpus/ (split version 1; its ``test`` half was measured once, 17/25
covered named first, 2/34 others claimed) against issue 36's targets, and fresh/ (split version 2's test half,
measured once at 3/22) with it at the figures it holds; both have been tuned on since. heldout3/ (split version
3's test half, measured once at 5/16 and reported; dev since split version 4) is asserted here too, tuned on since
(issue 36's fourth round). heldout4/ (split version 4's test half, measured once at 6/24 and 5/70 and reported; dev
since split version 5) is held at its tuned figures, heldout5/ (split version 5's test half, measured once at 18/31
and 5/62; dev since split version 6) and heldout6/ (split version 6's test half, measured once at 1/5 and 4/51; dev
since split version 7) at theirs; the held-out half of split version 7 (heldout7/) is never read here. Pastes of 13
threads that matrix.yaml or the older fixtures also cite are in the corpus (other comments or other parts of those
threads, not the text a rule was written from); the rest are from threads nothing else cites."""

import functools
import re
from pathlib import Path

import pytest

from fsdp_matrix.matrix import load_matrix
from fsdp_matrix.triage.aliases import ALIASES
from fsdp_matrix.triage.match import claims, match
from fsdp_matrix.triage.parse import parse
from tests.triage.corpus import CORPUS, load

ROOT = Path(__file__).resolve().parents[2]
MATRIX = load_matrix(ROOT / "matrix.yaml", check_repros=False)
FIXTURES = load(("dev",))  # no file of the held-out half is read here
# the pastes of the dev half, asserted paste by paste: corpus/ (split version 1, both its halves) and fresh/ (version
# 2's test half, measured once at 3/22 covered named first and reported, then tuned on: issue 36). Each miss is listed
# in MISSES. The held-out test half (heldout7/) is never asserted here: it is measured once, by
# python -m tests.triage.corpus --half test
TUNED = [fx for fx in FIXTURES if fx.half == "dev" and fx.folder in ("corpus", "fresh")]
# heldout3/ (version 3's test half, measured once at 5/16 covered named first, 5/50 others claimed, 0 strong wrong at
# bcc46c2, and reported; dev since split version 4), then tuned on (issue 36's fourth round): asserted with its misses
SPENT = [fx for fx in FIXTURES if fx.half == "dev" and fx.folder == "heldout3"]
# heldout4/ (version 4's test half, measured once at 6/24 covered named first, 5/70 others claimed, 0 strong wrong at
# b42289c, and reported; dev since split version 5), then tuned on: held at its figures, not paste by paste
SPENT4 = [fx for fx in FIXTURES if fx.half == "dev" and fx.folder == "heldout4"]
# heldout5/ (version 5's test half, measured once at 18/31 covered named first, 5/62 others claimed, 0 strong wrong at
# f94d008, and reported; dev since split version 6): held at its figures, not paste by paste
SPENT5 = [fx for fx in FIXTURES if fx.half == "dev" and fx.folder == "heldout5"]
# heldout6/ (version 6's test half, measured once at 1/5 covered named first, 4/51 others claimed, 0 strong wrong at
# 86de821, and reported; dev since split version 7): held at its figures, not paste by paste
SPENT6 = [fx for fx in FIXTURES if fx.half == "dev" and fx.folder == "heldout6"]
MISSES = {
    # pastes the matcher gets wrong, each a known gap (strict: a fix must remove it from here)
    "peft1910_dora_sft_head.txt": "DoRA names two cases alike, cut before its exception line: no claim",
    "trl1723_title_prepare.txt": "one message, two cases, nothing in the paste tells them apart, and no adapter word:"
    " neither claimed",
    # fresh/ (tuned on since issue 36)
    "axolotlpr345_input_require_grads_prose.txt": "a fix's title: enable_input_require_grads before get_peft_model,"
    " one phrase of gc-frozen-inputs' title (require grad), no checkpointing word",
    "discusspytorch211002_merge_adapter_shards.txt": "merge_adapter (not merge_and_unload) under FSDP, cut before the"
    " exception line: merge-under-fsdp's rule is the matrix's own check, which no paste prints",
    "peftpr1056_dpo_checkpointing_backward.txt": "a DPO log cut before its exception line: checkpoint's warning alone,"
    " no word of a PEFT adapter (alone, a model trained whole warns so too)",
    "pytorch109440_fsdp_qlora_uint8_request.txt": "a feature request quoting FSDP1's is_floating_point() test, not a"
    " message: no case's words ahead (its dtypes name several)",
    "transformers25841_peft_trainer_gc_title.txt": "a title: PEFT + Trainer + gradient checkpointing, one phrase of"
    " gc-frozen-inputs' title",
    "trlpr1654_no_upcast_fsdp_qlora_prose.txt": "'do not upcast adapters under FSDP + QLoRA': mixed-dtype's title says"
    " fp32-upcast adapters too, and its message ranks first",
    "trlpr6343_qlora_fsdp1_prepare_peft_prose.txt": "one message, two cases (mixed-dtype, trl-qlora-upcast); the"
    " paste's entry is prepare_peft_model, which neither case names",
    "llamafactory3206_qlora_load_requires_grad_title.txt": "another failure: the rule's message in a QLoRA title,"
    " claimed weak for fsdp2-qlora-accelerate",
    # heldout3/ (spent: tuned on since its one measurement)
    "litgptpr296_lora_merge_fsdp_prose.txt": "litgpt's own LoRA merge on FSDP shards in prose: one word of"
    " merge-under-fsdp's title (merge), no entry of it (merge_and_unload)",
    "peft2833_qlora_fsdp_8bit_title.txt": "an 8-bit QLoRA title and a launch command, no message: no case's title"
    " names 8-bit",
    "lorascripts482_flux_gc_title.txt": "another failure: a CJK title quoting torch's requires-grad message, too"
    " short a report to rule out FSDP, claimed weak",
}


@functools.cache
def _first(text):
    """The repository matrix's first claim on a paste, once per paste: the paste-by-paste test and each half's
    figures read the same answers (this file ran the matcher on each dev paste up to three times: 40 s of a run)."""
    found = claims(match(MATRIX, parse(text)))
    return (found[0].case.id, found[0].level) if found else (None, None)


@pytest.mark.parametrize(
    "fx",
    [
        pytest.param(fx, id=fx.name, marks=[pytest.mark.xfail(strict=True, reason=MISSES[fx.name])])
        if fx.name in MISSES
        else pytest.param(fx, id=fx.name)
        for fx in TUNED + SPENT
    ],
)
def test_the_corpus_paste_names_its_case_first_or_nothing(fx):
    first, level = _first(fx.text)
    assert first == fx.expected
    assert (level in ("strong", "likely", "weak")) is (first is not None)


def _figures(fixtures):
    """(covered named first, covered, others claimed, others, names of the strong claims that were wrong)."""
    answers = [(fx, _first(fx.text)) for fx in fixtures]
    covered = [(fx, first) for fx, (first, _) in answers if fx.expected]
    other = [(fx, first) for fx, (first, _) in answers if not fx.expected]
    named_first = sum(a == fx.expected for fx, a in covered)
    wrong = [fx.name for fx, (first, level) in answers if level == "strong" and first != fx.expected]
    return named_first, len(covered), sum(a is not None for _, a in other), len(other), wrong


def test_the_corpus_meets_the_targets():
    # issue 36's targets, met on corpus/ (split version 1, tuned on longest)
    named_first, covered, claimed, other, wrong = _figures([fx for fx in TUNED if fx.folder == "corpus"])
    assert covered >= 40 and other >= 50
    assert named_first >= 0.9 * covered and claimed * 15 <= other and not wrong


def test_the_dev_half_holds_its_figures():
    # the whole dev half (fresh/ too): precision as the targets ask; recall below the 90% target (fresh/'s misses are
    # in MISSES), held here at what it is so that a change that loses a paste shows
    named_first, covered, claimed, other, wrong = _figures(TUNED)
    assert (covered, other) == (65, 107)
    assert named_first >= 56 and claimed * 15 <= other and not wrong


def test_the_spent_held_out_half_holds_its_tuned_figures():
    # heldout3/ after tuning on it (5/16 and 5/50 when it was measured once, untuned): 14/16 and 1/50, held here
    named_first, covered, claimed, other, wrong = _figures(SPENT)
    assert (covered, other) == (16, 50)
    assert named_first >= 14 and claimed <= 1 and not wrong


def test_the_spent_version_4_half_holds_its_tuned_figures():
    # heldout4/ after tuning on it (6/24 and 5/70 when it was measured once, untuned): 8/24 and 2/70, then 12/24 and
    # 2/70 after the eighth round (dev), held here
    named_first, covered, claimed, other, wrong = _figures(SPENT4)
    assert (covered, other) == (24, 70)
    assert named_first >= 12 and claimed <= 2 and not wrong


def test_the_spent_version_5_half_holds_its_measured_figures():
    # 18/31 and 5/62 when measured once; 24/31 after the eighth round (dev), held here
    named_first, covered, claimed, other, wrong = _figures(SPENT5)
    assert (covered, other) == (31, 62)
    assert named_first >= 24 and claimed <= 5 and not wrong


def test_the_spent_version_6_half_holds_its_figures():
    # 1/5 and 4/51 when measured once; 1/5 and 2/51 after tuning on it (9b1b229); 1/5 and 3/51 after the eighth round,
    # which tuned on dev without reading this half (it was the held-out half then): held here
    named_first, covered, claimed, other, wrong = _figures(SPENT6)
    assert (covered, other) == (5, 51)
    assert named_first >= 1 and claimed <= 3 and not wrong


def test_the_corpus_is_real_pastes_each_with_its_thread():
    cited = (ROOT / "matrix.yaml").read_text() + "".join(p.read_text() for p in CORPUS.parent.glob("*.txt"))
    for fx in TUNED:  # the held-out half is checked by tests/triage/test_corpus.py (no thread cited anywhere)
        assert re.fullmatch(
            r"https://(github\.com/[\w.-]+/[\w.-]+/(issues|pull)/\d+|discuss\.pytorch\.org/t/[\w-]+/\d+)", fx.url
        ), fx.name
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
    assert _first(fx.text)[0] == "trl-qlora-upcast"
    assert _first(fx.text.replace("DPO Trainer", "Trainer").replace("prepare_for_kbit_training", "x"))[0] == (
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
    # the second is tied to the first as much: it was printed strong below a likely first claim (split version 7's
    # ms-swift paste, read after its measurement)
    assert found[1].level == "likely" and found[1].tied == found[0].case.id


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


INTEGER = (
    "QLoRA under FSDP with accelerate launch, torch 2.0.1:\n"
    '  File "/env/lib/python3.10/site-packages/torch/distributed/fsdp/flat_param.py", line 435, in _init_flat_param\n'
    '    raise ValueError("Integer parameters are unsupported")\n'
    "ValueError: Integer parameters are unsupported\n"
)


def test_torch_2_0_s_wording_of_the_integer_check_is_mixed_dtype_s_rule_never_strong():
    """torch <= 2.0 raised FSDP1's integer-parameter check as 'Integer parameters are unsupported': no rule held it."""
    [first, *_] = claims(match(MATRIX, parse(INTEGER)))
    assert (first.case.id, first.level, first.hits[0].fit) == ("mixed-dtype", "likely", "alias")
    assert any("torch <= 2.0" in note for note in first.hits[0].notes)
    # an integer dtype named second in the uniform-dtype message is the same check (a float parameter came first)
    title = (
        "LoRA on an 8-bit base under FSDP: `FlatParameter` requires uniform dtype but got torch.float32 and torch.int8"
    )
    assert _first(title)[0] == "mixed-dtype"
    # two floating dtypes are the uniform-dtype rules' own failure, not the integer check
    assert not [a for a in ALIASES if a.wording.search(title.replace("torch.int8", "torch.float16"))]


WARNED = (
    "LoRA under FSDP1 with use_orig_params=True prints, for each decoder layer:\n"
    "/env/lib/python3.11/site-packages/torch/distributed/fsdp/_wrap_utils.py:174: UserWarning: model.layers.0 has both "
    "parameters with requires_grad=True and False. We do not recommend wrapping such modules\n"
)


def test_a_warning_a_case_expects_is_read_from_the_line_python_prints():
    """fsdp1-frozen-mixed-unit expects a UserWarning, which triage never read: a paste of it was not claimed."""
    [first, *_] = claims(match(MATRIX, parse(WARNED)))
    assert (first.case.id, first.level, first.hits[0].fit) == ("fsdp1-frozen-mixed-unit", "likely", "warning")
    windows = WARNED.replace("/env/lib/python3.11/site-packages/", "C:\\env\\Lib\\site-packages\\")
    assert claims(match(MATRIX, parse(windows)))[0].hits[0].level == "likely"
    # the warning's words in a sentence, without the line Python prints, are not the warning
    sentence = "LoRA under FSDP1: it says a layer has both parameters with requires_grad=True and False, I think\n"
    assert "fsdp1-frozen-mixed-unit" not in {m.case.id for m in claims(match(MATRIX, parse(sentence)))}


CHECKPOINT_WARNING = (
    "Fine-tuning with the Trainer, gradient_checkpointing=True:\n"
    "/env/lib/python3.10/site-packages/torch/utils/checkpoint.py:31: UserWarning: None of the inputs have "
    "requires_grad=True. Gradients will be None\n"
    '  warnings.warn("None of the inputs have requires_grad=True. Gradients will be None")\n'
)
ELEMENT_0 = (
    "Traceback (most recent call last):\n"
    '  File "/env/lib/python3.10/site-packages/transformers/trainer.py", line 2669, in training_step\n'
    "    self.accelerator.backward(loss)\n"
    '  File "/env/lib/python3.10/site-packages/torch/_tensor.py", line 487, in backward\n'
    "    torch.autograd.backward(\n"
    '  File "/env/lib/python3.10/site-packages/torch/autograd/__init__.py", line 200, in backward\n'
    "    Variable._execution_engine.run_backward(\n"
    "RuntimeError: element 0 of tensors does not require grad and does not have a grad_fn\n"
)


def test_the_warning_an_error_comes_after_shows_its_cause_without_an_adapter_word():
    """no-grad-fn's run warns first (torch's reentrant checkpoint: no input needs grad). Without that warning, the
    message in a report that shows neither FSDP nor an adapter is not claimed (a frozen model raises it too); with
    it, the cause is shown. Seen failing before: two dev pastes of that shape (peft PR #1056's DPO log, a Chinese
    SFT log) were not named."""
    said = "We train a model on 8 GPUs with our own script, and backward fails after the first step of the run.\n"
    assert claims(match(MATRIX, parse(said + ELEMENT_0))) == []
    [first, *_] = claims(match(MATRIX, parse(said + CHECKPOINT_WARNING + ELEMENT_0)))
    assert first.case.id in ("gc-frozen-inputs", "ac-entries") and first.level in ("weak", "likely")
    assert any("after the UserWarning its run raises first" in e for e in first.hits[0].evidence)
    # the warning alone (a log cut before the error) names the case too, from the line Python prints
    [alone, *_] = claims(match(MATRIX, parse("LoRA SFT:\n" + CHECKPOINT_WARNING)))
    assert alone.case.id in ("gc-frozen-inputs", "ac-entries") and alone.hits[0].fit == "warning"
    # the warning, then another error (sd-scripts#1509's shape): that error is the report's
    other = "RuntimeError: only Tensors of floating point dtype can require gradients\n"
    assert claims(match(MATRIX, parse("LoRA SFT:\n" + CHECKPOINT_WARNING + other))) == []


def test_a_warning_quoted_in_the_title_is_read_where_the_log_prints_it():
    """Only the first place of the warning's words was looked at: a title that quotes the warning hid the line the
    log prints below it (seen failing before the fix, on a report of split version 4's held-out half after its one
    measurement)."""
    title = "None of the inputs have requires_grad=True. Gradients will be None\n\nLoRA training prints:\n"
    [first, *_] = claims(match(MATRIX, parse(title + CHECKPOINT_WARNING)))
    assert first.case.id in ("gc-frozen-inputs", "ac-entries") and first.hits[0].fit == "warning"
    assert claims(match(MATRIX, parse(title))) == []  # the words alone are not the printed warning


def test_a_warning_quoted_after_its_class_in_a_title_is_the_warning():
    """A title "UserWarning for DPO with LoRA: None of the inputs have requires_grad=True" quotes the warning as the
    user saw it, without the file that raised it; the words without the class stay a sentence (seen failing before
    on a dev paste of that shape, split version 4's spent half)."""
    title = (
        "UserWarning when training DPO with LoRA: None of the inputs have requires_grad=True. Gradients will be None\n"
    )
    [first, *_] = claims(match(MATRIX, parse(title)))
    assert first.case.id in ("gc-frozen-inputs", "ac-entries") and first.level == "weak"
    assert any("quoted after its class" in e for e in first.hits[0].evidence)
    sentence = title.replace("UserWarning when", "When")
    assert claims(match(MATRIX, parse(sentence))) == []


def test_another_op_s_mixed_tensor_message_is_not_the_rule_s_and_words_need_the_rule_s_entry():
    """``aten.mm`` got mixed Tensor and DTensor in a loss fit ``aten.copy_``'s rule loosely (one word short), and the
    message's own words in a title named generate-fsdp2, whose rule needs ``generate()`` (seen failing before: two
    dev pastes, a torchtune PR and a TRL PR, each about a loss under FSDP2 + LoRA)."""
    said = (
        "Chunked loss under FSDP2 + LoRA fails with mixed Tensor and DTensor\n\n"
        "RuntimeError: aten.mm.default got mixed torch.Tensor and DTensor, need to convert all torch.Tensor to "
        "DTensor before calling distributed operators!\n"
    )
    assert claims(match(MATRIX, parse(said))) == []
    grpo = said.replace("Chunked loss under", "GRPO under")
    assert _first(grpo)[0] == "generate-fsdp2"


def test_a_dtype_mismatch_told_in_words_names_the_uniform_dtype_case_of_the_report_s_fsdp():
    """A report that tells the mismatch without its message (llama-cookbook's "mixed precision error", "dtype
    mismatch between bfloat16 and uint8") named nothing; seen failing before on two dev pastes of that shape."""
    fsdp1 = "LoRA fine-tuning with FSDP fails: a dtype mismatch between the bf16 base and the fp32 LoRA weights.\n"
    [first] = claims(match(MATRIX, parse(fsdp1)))
    assert (first.case.id, first.level, first.hits[0].fit) == ("mixed-dtype", "weak", "words")
    fsdp2 = fsdp1.replace("with FSDP", "with FSDP2 (fully_shard)")
    [first] = claims(match(MATRIX, parse(fsdp2)))
    assert (
        first.case.id == "fsdp2-mixed-dtype-unit" and "original parameter" in first.hits[0].signature.rule.error.match
    )
    # a matmul's "must have the same dtype" is another failure; no adapter or no FSDP: nothing ties it to a case
    assert (
        claims(match(MATRIX, parse(fsdp1.replace("a dtype mismatch", "mat1 and mat2 must have the same dtype")))) == []
    )
    assert claims(match(MATRIX, parse(fsdp1.replace("LoRA ", "full ").replace(" LoRA", " new")))) == []
    assert claims(match(MATRIX, parse(fsdp1.replace("with FSDP", "with DDP")))) == []
    # a "type" that is not a dtype is no mismatch of dtypes (seen failing before: a wrap-policy PR's "different types"
    # of layers, split version 6's spent half)
    layers = "PEFT's FSDP auto wrap policy with LoRA cannot wrap two different types of decoder layers at once.\n"
    assert claims(match(MATRIX, parse(layers))) == []
    # with an exception line, the message decides (a described mismatch beside another error names nothing)
    assert claims(match(MATRIX, parse(fsdp1 + "OSError: [Errno 28] No space left on device\n"))) == []


def test_words_of_a_case_on_another_stack_do_not_name_it():
    """A QLoRA-only case's words in a report with no quantized base, and an FSDP1 case's words in a report of FSDP2
    only, named those cases (seen failing before: two other pastes of split version 4's spent half, after its one
    measurement: an FSDP2 save hang and an FSDP2 LoRA save)."""
    save = (
        "Saving a LoRA model under FSDP with get_model_state_dict(full_state_dict=True, cpu_offload=True) writes "
        "nothing useful; the run itself trains fine on 8 GPUs.\n"
    )
    assert claims(match(MATRIX, parse(save))) == []
    assert _first(save.replace("a LoRA model", "a QLoRA model")) == ("qlora-full-state-dict", "weak")
    sft = (
        "Training LoRA with TRL's SFTTrainer under FSDP2 (fully_shard): the optimizer step fails after the first "
        "batch of the run.\n"
    )
    assert claims(match(MATRIX, parse(sft))) == []
    assert claims(match(MATRIX, parse(sft.replace("FSDP2 (fully_shard)", "FSDPv2")))) == []  # as the Trainer says it
    fsdp1 = sft.replace("FSDP2 (fully_shard)", "FSDP1 (FullyShardedDataParallel)")
    assert _first(fsdp1) == ("fsdp1-mp-optimizer-dtype", "weak")


def test_a_message_wrapped_inside_a_word_fits_its_rule_as_printed():
    """A terminal wraps at its width, inside a word as often as at a space: ``... object ha`` / ``s no attribute``.
    A short message (``'Params4bit' object has no attribute 'absmax'``) is too generic to fit with its values taken
    out, so only its exact words tell it: the wrap point is read both ways (a space or none)."""
    head = "Saving FSDP QLoRA weights with get_model_state_dict(full_state_dict=True, cpu_offload=True):\n"
    whole = head + "[rank1]: AttributeError: 'Params4bit' object has no attribute 'absmax'\n"
    wrapped = head + "[rank1]: AttributeError: 'Params4bit' object ha\ns no attribute 'absmax'\n"
    assert _first(whole)[0] == "qlora-full-state-dict"
    assert _first(wrapped) == _first(whole)


def test_a_title_wrapped_over_two_lines_fits_as_one_line():
    """A title or sentence that quotes a message with a typo (a loose fit, read line by line so that words scattered
    over a paste do not add up) still fits when the quote is wrapped onto the next line."""
    title = "qlora fsdp: Must flatten tensors with uniform dtype but got torch.float32 and torch.bloat16\n"
    wrapped = title.replace(" and ", " and\n")
    assert _first(title)[0] == "mixed-dtype"
    assert _first(wrapped) == _first(title)
