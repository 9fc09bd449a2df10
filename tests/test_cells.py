from pathlib import Path

import pytest

from fsdp_matrix.axes import cell_id
from fsdp_matrix.cells import Cell, expand, find_cell, matches, unmet_requirement
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


def _with_layout_grid(**layout):
    data = matrix_data()
    data["cases"][0]["grids"].append(
        {"adapter": ["lora"], "dtype": ["fp32"], "wrap": ["fsdp2"], "model": ["gemma"], **layout}
    )
    return data


def test_a_grid_pins_its_layout_and_the_id_names_it():
    m = parse_matrix(_with_layout_grid(world_size=[4], nodes=[1, 2]))
    cells = {c.id: c for c in expand(m)}
    assert cells["lora-fp32-fsdp2-gemma-ws4"].layout == (4, 1)
    assert cells["lora-fp32-fsdp2-gemma-ws4-n2"].layout == (4, 2)
    assert "world_size" not in cells["lora-fp32-fsdp2-gemma-ws4"].params_dict  # a launch setting, not a param
    # the grids that pin nothing take the run's layout, pinned ones keep theirs
    again = {c.id for c in expand(m, "cpu", 8, nodes=2)}
    assert {"lora-fp32-fsdp2-llama-ws8-n2", "lora-fp32-fsdp2-gemma-ws4", "lora-fp32-fsdp2-gemma-ws4-n2"} <= again
    assert cell_id({"adapter": "lora"}, 4, 1) == "lora-ws4"


def test_find_cell_takes_the_layout_from_the_id():
    m = parse_matrix(_with_layout_grid(world_size=[4], nodes=[2]))
    assert find_cell(m, "lora-requires-grad/lora-fp32-fsdp2-gemma-ws4-n2").layout == (4, 2)
    assert find_cell(m, "lora-fp32-fsdp2-llama-ws4-n2").layout == (4, 2)  # a grid without one, at that layout


def test_rules_can_match_the_node_count():
    cell = Cell("c", (("wrap", "fsdp2"),), "cpu", 4, 2)
    assert matches({"nodes": 2, "world_size": 4}, cell.context())
    assert not matches({"nodes": 1}, cell.context())


@pytest.mark.parametrize(
    "layout, named",
    [
        ({"nodes": [2]}, "grids[2].nodes: give world_size beside it"),
        ({"world_size": [5], "nodes": [2]}, "grids[2].world_size: 5 ranks do not split evenly over 2 nodes"),
        ({"world_size": [0]}, "grids[2].world_size: 0 is not a positive integer"),
        ({"world_size": ["4"]}, "grids[2].world_size: '4' is not a positive integer"),
        ({"device": ["cpu"]}, "grids[2].device: the device is the run's"),
    ],
)
def test_a_bad_layout_is_one_line_naming_the_key(layout, named):
    with pytest.raises(Exception) as info:
        parse_matrix(_with_layout_grid(**layout))
    assert named in str(info.value) and "\n" not in str(info.value).strip()
