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
