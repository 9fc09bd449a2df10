from fsdp_matrix.cells import Cell
from fsdp_matrix.expectations import Expected, expected_for, signature_matches, version_matches
from fsdp_matrix.matrix import parse_matrix
from tests.helpers import matrix_data

CURRENT = {"torch": "2.13.0+cpu", "peft": "0.21.2", "transformers": "5.23.0"}


def _cell(**params):
    return Cell("lora-requires-grad", tuple(sorted(params.items())))


def test_first_matching_rule_wins_with_versions():
    case = parse_matrix(matrix_data()).case("lora-requires-grad")
    e = expected_for(case, _cell(orig=0, wrap="decoder_layer"), CURRENT)
    assert (e.kind, e.error_type, e.rule) == ("error", "ValueError", 0)
    old_torch = expected_for(case, _cell(orig=0, wrap="decoder_layer"), {**CURRENT, "torch": "2.0.1"})
    assert old_torch.rule == 1
    assert expected_for(case, _cell(orig=1, wrap="decoder_layer"), CURRENT).kind == "ok"
    skip = expected_for(case, _cell(orig=1, wrap="decoder_layer"), {**CURRENT, "peft": "0.10.0"})
    assert skip.kind == "skip" and skip.reason == "too old"


def test_no_rule_is_kind_none():
    data = matrix_data()
    data["cases"][0]["expect"] = data["cases"][0]["expect"][:1]
    case = parse_matrix(data).case("lora-requires-grad")
    assert expected_for(case, _cell(orig=1, wrap="decoder_layer"), CURRENT).kind == "none"


def test_version_matching_ignores_local_labels_and_missing_packages():
    assert version_matches("==2.13.0", "2.13.0+cpu")
    assert version_matches(">=2.1", "2.13.0+cu121")
    assert not version_matches(">=0.14", "0.13.2")
    assert not version_matches(">=0", None)


def test_signature_type_regex_and_module_prefix():
    e = Expected("error", "ValueError", "uniform `?requires_grad`?", "torch.distributed.fsdp._flat_param")
    msg = "Must flatten tensors with uniform `requires_grad` when `use_orig_params=False`"
    loc = "torch.distributed.fsdp._flat_param._validate_tensors_to_flatten"
    assert signature_matches(e, "ValueError", msg, loc)
    assert signature_matches(e, "ValueError", msg.replace("`", ""), loc)  # issue threads drop backticks
    assert not signature_matches(e, "TypeError", msg, loc)
    assert not signature_matches(e, "ValueError", "Must flatten tensors with uniform dtype", loc)
    assert not signature_matches(e, "ValueError", msg, "torch.distributed.fsdp._wrap_utils.x")
    assert not signature_matches(e, "ValueError", msg, "torch.distributed.fsdp._flat_param_x.y")
    qualified = Expected("error", "IndexError", "tuple index")
    assert signature_matches(qualified, "IndexError", "tuple index out of range", None)
    assert signature_matches(Expected("error", "CheckFailed", "x"), "fsdp_matrix.errors.CheckFailed", "x", None)
