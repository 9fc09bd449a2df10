import pytest

from fsdp_matrix.pytest_plugin import check_record
from fsdp_matrix.records import Observed, RankResult, Record
from fsdp_matrix.report.failure import failure_text


def _record(verdict, status="error", ranks=()):
    return Record(
        case="dora-sharded-weight",
        cell="dora-fp32-orig1-peft_policy-llama-ws2",
        params={},
        versions={},
        device="cpu",
        world_size=2,
        expected={"kind": "ok"},
        observed=Observed(
            status=status, error_type="IndexError", error_message="tuple index out of range", ranks=list(ranks)
        ),
        verdict=verdict,
        duration_s=0.1,
        line="expected ok / observed IndexError: tuple index out of range",
    )


def test_failure_text_has_the_line_and_every_rank():
    ranks = [
        RankResult(rank=0, status="error", traceback="Traceback...\nIndexError: tuple index out of range"),
        RankResult(
            rank=1, status="crash", exit_code=-11, signal="SIGSEGV", stack="Fatal Python error: Segmentation fault"
        ),
    ]
    text = failure_text(_record("REGRESSION", ranks=ranks))
    first, *rest = text.splitlines()
    assert first == (
        "REGRESSION: dora-sharded-weight/dora-fp32-orig1-peft_policy-llama-ws2: "
        "expected ok / observed IndexError: tuple index out of range"
    )
    assert "--- rank 0: error" in rest and "--- rank 1: crash, exit code -11 (SIGSEGV)" in rest
    assert "Fatal Python error: Segmentation fault" in text


@pytest.mark.parametrize("verdict", ["REGRESSION", "UNEXPECTED-FIX", "DIFFERENT-ERROR", "hang", "crash", "env-error"])
def test_only_matching_outcomes_pass(verdict):
    with pytest.raises(pytest.fail.Exception):
        check_record(_record(verdict))


def test_matches_pass_and_skips_skip():
    check_record(_record("reproduced"))
    check_record(_record("fix-holds", status="ok"))
    with pytest.raises(pytest.skip.Exception, match="needs cuda"):
        check_record(
            Record(
                **{**_record("skipped").__dict__, "observed": Observed(status="skipped", error_message="needs cuda")}
            )
        )
