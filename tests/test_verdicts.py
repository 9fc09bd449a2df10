import pytest

from fsdp_matrix.expectations import Expected
from fsdp_matrix.verdicts import Verdict, judge

OK = Expected("ok")
ERR = Expected("error", "IndexError", "tuple index out of range", "peft.tuners.lora")
NONE = Expected("none")


@pytest.mark.parametrize(
    "expected,status,etype,msg,loc,verdict",
    [
        (ERR, "error", "IndexError", "tuple index out of range", "peft.tuners.lora.dora.forward", Verdict.REPRODUCED),
        (OK, "ok", None, None, None, Verdict.FIX_HOLDS),
        (OK, "error", "ValueError", "boom", "x", Verdict.REGRESSION),
        (OK, "error", "fsdp_matrix.errors.CheckFailed", "adapter weights unchanged", "x", Verdict.REGRESSION),
        (ERR, "ok", None, None, None, Verdict.UNEXPECTED_FIX),
        (ERR, "error", "AttributeError", "no attribute", "peft.tuners.lora.layer.f", Verdict.DIFFERENT_ERROR),
        (ERR, "error", "IndexError", "tuple index out of range", "torch.nn.x", Verdict.DIFFERENT_ERROR),
        (NONE, "ok", None, None, None, Verdict.DIFFERENT_ERROR),
        (NONE, "error", "X", "y", None, Verdict.DIFFERENT_ERROR),
        (OK, "hang", None, "no result within 60s", None, Verdict.HANG),
        (ERR, "crash", None, "rank 0 died with exit code -11 (SIGSEGV)", None, Verdict.CRASH),
        (OK, "skipped", None, "needs cuda", None, Verdict.SKIPPED),
        (OK, "env-error", "EnvError", "install failed", None, Verdict.ENV_ERROR),
    ],
)
def test_verdict_table(expected, status, etype, msg, loc, verdict):
    assert judge(expected, status, etype, msg, loc).verdict is verdict


def test_only_matches_pass():
    assert {v for v in Verdict if v.passed} == {Verdict.REPRODUCED, Verdict.FIX_HOLDS}


def test_line_says_expected_and_observed():
    line = judge(OK, "error", "ValueError", "Must flatten\nsecond line", "torch.x.f").line
    assert line == "expected ok / observed ValueError: Must flatten in torch.x.f"


def test_unknown_status_is_a_bug():
    with pytest.raises(ValueError):
        judge(OK, "fine")


SIG = {
    "id": "fsdp2-no-cpu",
    "reason": "FSDP2 has no CPU path",
    "source": "o",
    "errors": [{"type": "AttributeError", "match": "record_event"}],
}


@pytest.mark.parametrize(
    "expected,status,etype,msg,verdict",
    [
        # an error no rule expected that fits the signature: skipped, whether ok, another error or nothing was expected
        (Expected("ok", signatures=(SIG,)), "error", "AttributeError", "no attribute 'record_event'", Verdict.SKIPPED),
        (
            Expected("error", "ValueError", "x", signatures=(SIG,)),
            "error",
            "AttributeError",
            "record_event",
            Verdict.SKIPPED,
        ),
        (Expected("none", signatures=(SIG,)), "error", "AttributeError", "record_event", Verdict.SKIPPED),
        # never an ok run, a matched expectation, or an error that does not fit
        (Expected("ok", signatures=(SIG,)), "ok", None, None, Verdict.FIX_HOLDS),
        (
            Expected("error", "AttributeError", "record_event", signatures=(SIG,)),
            "error",
            "AttributeError",
            "record_event",
            Verdict.REPRODUCED,
        ),
        (Expected("error", "AttributeError", "x", signatures=(SIG,)), "ok", None, None, Verdict.UNEXPECTED_FIX),
        (Expected("ok", signatures=(SIG,)), "error", "RuntimeError", "record_event", Verdict.REGRESSION),
        (Expected("ok", signatures=(SIG,)), "crash", None, "SIGSEGV", Verdict.CRASH),
    ],
)
def test_platform_signature_relabels_only_unexpected_errors(expected, status, etype, msg, verdict):
    judgement = judge(expected, status, etype, msg, None)
    assert judgement.verdict is verdict
    if verdict is Verdict.SKIPPED:
        # the line still shows what was observed, then which signature judged it
        assert f"observed {etype}: {msg}" in judgement.line and "platform signature fsdp2-no-cpu" in judgement.line


# ---- hang and warning expectations --------------------------------------------------------------------------------

HANG = Expected("hang", match="_all_gather_base|all_gather", timeout_s=20)
STUCK = 'File ".../torch/distributed/distributed_c10d.py", line 3420 in all_gather_into_tensor'
ELSEWHERE = 'File ".../time.py", line 1 in sleep'
WARN = Expected("warning", warning={"type": "UserWarning", "match": "requires_grad=True and False"})
QUIET = Expected("ok", no_warning={"type": "UserWarning", "match": "requires_grad=True and False"})
SEEN = {"category": "UserWarning", "message": "x has both parameters with requires_grad=True and False.", "count": 1}


@pytest.mark.parametrize(
    "expected,status,stacks,verdict",
    [
        (HANG, "hang", [None, STUCK], Verdict.REPRODUCED),  # any rank's stack where the rule says
        (HANG, "hang", [ELSEWHERE, ELSEWHERE], Verdict.DIFFERENT_ERROR),  # hung, but somewhere else
        (HANG, "hang", [], Verdict.DIFFERENT_ERROR),  # no stack at all: nothing shows where it hung
        (Expected("hang", timeout_s=20), "hang", [ELSEWHERE], Verdict.REPRODUCED),  # no stack regex: any hang
        (HANG, "ok", [], Verdict.UNEXPECTED_FIX),
        (HANG, "crash", [], Verdict.CRASH),
        (OK, "hang", [STUCK], Verdict.HANG),  # an unexpected hang stays a hang
        (ERR, "hang", [STUCK], Verdict.HANG),
    ],
)
def test_hang_expectations(expected, status, stacks, verdict):
    assert judge(expected, status, stacks=stacks).verdict is verdict


def test_an_error_where_a_hang_was_expected_is_a_different_error():
    j = judge(HANG, "error", "ValueError", "boom", "x.y")
    assert j.verdict is Verdict.DIFFERENT_ERROR
    assert j.line.startswith("expected hang within 20s")


@pytest.mark.parametrize(
    "expected,warnings,verdict",
    [
        (WARN, [SEEN], Verdict.REPRODUCED),
        (WARN, [], Verdict.UNEXPECTED_FIX),
        (WARN, [{**SEEN, "category": "FutureWarning"}], Verdict.UNEXPECTED_FIX),  # the type must be the rule's
        (WARN, [{**SEEN, "category": "some.module.UserWarning"}], Verdict.REPRODUCED),  # qualified by its module
        (QUIET, [], Verdict.FIX_HOLDS),
        (QUIET, [SEEN], Verdict.REGRESSION),
        (OK, [SEEN], Verdict.FIX_HOLDS),  # a rule that says nothing about warnings ignores them
    ],
)
def test_warning_expectations_on_a_run_that_trained(expected, warnings, verdict):
    assert judge(expected, "ok", warnings=warnings).verdict is verdict


def test_warning_lines_say_what_was_raised():
    assert judge(QUIET, "ok", warnings=[SEEN]).line == (
        "expected ok, without UserWarning: /requires_grad=True and False/ / observed ok, with UserWarning: "
        "x has both parameters with requires_grad=True and False."
    )
    assert judge(WARN, "ok").line.endswith("observed ok, without UserWarning: /requires_grad=True and False/")
    assert judge(WARN, "error", "ValueError", "boom", None).verdict is Verdict.DIFFERENT_ERROR


def test_a_source_pin_at_a_release_tag_is_not_labelled_not_released_yet():
    """A source pin at v0.14.0 (installed as 0.14.0, clean) was labelled "changed on main, not released yet"."""
    from fsdp_matrix.verdicts import changed_note

    at_tag = {"peft": {"url": "/c", "ref": "v0.14.0", "commit": "8a2b3c4d5e", "dirty": None, "release": "0.14.0"}}
    note = changed_note(at_tag, {"peft": "0.14.0"})
    assert "not released yet" not in note and "released version" in note and "its release's own commit" in note
    after = {"peft": {**at_tag["peft"], "ref": "main"}}
    assert changed_note(after, {"peft": "0.14.1.dev0"}).startswith("changed on main, not released yet")
    dirty = {"peft": {**at_tag["peft"], "dirty": "3 files"}}
    assert "not released yet" in changed_note(dirty, {"peft": "0.14.0"})


NO_GRAD = Expected(
    "error",
    "RuntimeError",
    "element 0 of tensors does not require grad",
    "torch.autograd",
    warning={"type": "UserWarning", "match": "None of the inputs have requires_grad=True"},
)
"""matrix.yaml's ``no-grad-fn``: the error, after torch's reentrant checkpoint warning."""
CHECKPOINT_WARNED = {
    "category": "UserWarning",
    "message": "None of the inputs have requires_grad=True. Gradients will be None",
}


def test_an_error_rule_with_a_warning_reproduces_only_after_that_warning():
    """The same message without the warning is another way to it (e.g. a loss computed under no_grad)."""
    raised = (
        "RuntimeError",
        "element 0 of tensors does not require grad and does not have a grad_fn",
        "torch.autograd",
    )
    warned = judge(NO_GRAD, "error", *raised, warnings=[CHECKPOINT_WARNED])
    assert warned.verdict is Verdict.REPRODUCED
    assert "after UserWarning: /None of the inputs" in warned.line
    assert warned.line.endswith("after UserWarning: None of the inputs have requires_grad=True. Gradients will be None")
    alone = judge(NO_GRAD, "error", *raised)
    assert alone.verdict is Verdict.DIFFERENT_ERROR
    assert alone.line.endswith("before it (the rule's warning was not raised before it)")
    # a run that trains is still an unexpected fix, warned or not
    assert judge(NO_GRAD, "ok", warnings=[CHECKPOINT_WARNED]).verdict is Verdict.UNEXPECTED_FIX
