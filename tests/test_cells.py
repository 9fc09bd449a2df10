from pathlib import Path

import pytest

from fsdp_matrix.cells import Cell, cell_id, expand, find_cell, matches, unmet_requirement
from fsdp_matrix.errors import UnknownCellError
from fsdp_matrix.matrix import load_matrix, parse_matrix
from tests.helpers import matrix_data


def test_ids_are_stable_and_readable():
    assert (
        cell_id({"adapter": "dora", "dtype": "bf16", "orig": 1, "wrap": "peft_policy", "model": "llama"}, 2)
        == "dora-bf16-orig1-peft_policy-llama-ws2"
    )
    assert (
        cell_id({"model": "llama", "adapter": "qlora", "storage": "uint8", "autocast": True}, 1)
        == "qlora-llama-autocast1-storage_uint8-ws1"
    )


def test_expand_is_union_of_grids_in_order():
    m = parse_matrix(matrix_data())
    ids = [c.id for c in expand(m)]
    assert ids == [
        "lora-fp32-orig0-decoder_layer-llama-ws2",
        "lora-fp32-orig1-decoder_layer-llama-ws2",
        "lora-fp32-fsdp2-llama-ws2",
    ]
    assert all(c.key.startswith("lora-requires-grad/") for c in expand(m))


def test_find_cell_takes_world_size_from_id():
    m = parse_matrix(matrix_data())
    cell = find_cell(m, "lora-requires-grad/lora-fp32-fsdp2-llama-ws1")
    assert cell.world_size == 1 and cell.params_dict["wrap"] == "fsdp2"
    assert find_cell(m, "lora-fp32-fsdp2-llama-ws2").case == "lora-requires-grad"
    with pytest.raises(UnknownCellError):
        find_cell(m, "lora-fp32-fsdp2-gemma-ws2")


def test_matches_lists_and_bools():
    ctx = {"orig": 1, "wrap": "fsdp2", "device": "cpu"}
    assert matches({"orig": True}, ctx)
    assert not matches({"orig": False}, ctx)
    assert matches({"wrap": ["peft_policy", "fsdp2"]}, ctx)
    assert not matches({"model": "llama"}, ctx)


def test_requirements_give_reasons():
    m = parse_matrix(matrix_data())
    case = m.case("lora-requires-grad")
    ws1 = Cell(case.id, (("wrap", "fsdp2"),), "cpu", 1)
    assert "needs world size >= 2" in unmet_requirement(case.requires, ws1)
    assert unmet_requirement(case.requires, Cell(case.id, (("wrap", "fsdp2"),), "cpu", 2)) is None


FIXTURE_IDS = Path(__file__).parent / "fixtures" / "cell_ids.txt"


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_cell_ids_of_main_never_change(device):
    """Cell ids are public: every key main expanded stays, spelled the same (a new cell may only be added)."""
    pinned = [line for line in FIXTURE_IDS.read_text().splitlines() if line and not line.startswith("#")]
    now = [c.key for c in expand(load_matrix(), device, 2)]
    assert len(now) == len(set(now))
    assert [k for k in pinned if k not in set(now)] == []
    # main's cells keep their order; cells added since follow in the order of their cases
    assert [k for k in now if k in set(pinned)] == pinned
