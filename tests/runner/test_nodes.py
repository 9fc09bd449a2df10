"""Layouts: a cell runs at the world size and node count its id names, in launches of that size, or not at all.

The 2-node cells run for real on this machine: two torchrun agents (``--nnodes 2 --node-rank 0/1``, c10d on
127.0.0.1), each node with its own launch directory and scratch, watched by the one launcher (crash and hang on
node 1 included).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from fsdp_matrix.cells import expand
from fsdp_matrix.errors import LaunchError
from fsdp_matrix.matrix import load_matrix
from fsdp_matrix.options import LaunchOptions
from fsdp_matrix.runner.factory import layout_refusal, open_session
from fsdp_matrix.runner.launcher import Launcher
from fsdp_matrix.runner.session import Session

HERE = Path(__file__).resolve().parent
MATRIX = HERE / "node_matrix.yaml"


def _cells():
    return {c.params_dict["probe"] + "-" + "x".join(map(str, c.layout)): c for c in expand(load_matrix(MATRIX))}


def test_ids_name_the_global_world_size_and_the_nodes():
    cells = _cells()
    assert cells["where-2x1"].id == "probe_where-ws2"  # the run's layout: the id as it always was
    assert cells["where-4x2"].id == "probe_where-ws4-n2"
    assert cells["exit_rank3-4x2"].id == "probe_exit_rank3-ws4-n2"


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    results = tmp_path_factory.mktemp("nodes")
    opts = LaunchOptions(results=results, matrix=MATRIX, cell_timeout=15.0)
    session = open_session(opts, load_matrix(MATRIX), python=sys.executable, versions={"torch": "2.13.0"})
    cells = _cells()
    order = ["where-2x1", "where-4x2", "exit_rank3-4x2", "hang_rank2-4x2"]
    session.prefetch([cells[k] for k in order])
    try:
        return {k: session.run(cells[k]) for k in order}
    finally:
        session.close()


@pytest.mark.heavy  # nox -s heavy: two torchrun agents, 4 ranks, a crash and a hang (~70 s)
def test_each_cell_runs_at_its_own_layout(records):
    assert records["where-2x1"].verdict == "fix-holds", records["where-2x1"].line
    assert (records["where-2x1"].world_size, records["where-2x1"].nodes) == (2, 1)
    assert [r["world_size"] for r in records["where-2x1"].observed.checks["ranks"]] == [2, 2]
    rec = records["where-4x2"]
    assert rec.verdict == "fix-holds", rec.line
    assert (rec.world_size, rec.nodes, rec.cell) == (4, 2, "probe_where-ws4-n2")
    ranks = rec.observed.checks["ranks"]
    assert [(r["rank"], r["node"], r["local_rank"], r["world_size"]) for r in ranks] == [
        (0, 0, 0, 4),
        (1, 0, 1, 4),
        (2, 1, 0, 4),
        (3, 1, 1, 4),
    ]
    assert {r["local_world_size"] for r in ranks} == {2}
    # the rendezvous and the ranks' sockets stay on loopback
    assert {r["master_addr"] for r in ranks} == {"127.0.0.1"}
    assert all(r["gloo_ifname"] for r in ranks)


@pytest.mark.heavy  # nox -s heavy: two torchrun agents, 4 ranks, a crash and a hang (~70 s)
def test_each_node_has_its_own_scratch_written_by_its_local_rank_0(records):
    ranks = records["where-4x2"].observed.checks["ranks"]
    assert ranks[0]["scratch"] == ranks[1]["scratch"] != ranks[2]["scratch"] == ranks[3]["scratch"]
    assert [r["scratch_holds"] for r in ranks] == ["node 0, rank 0"] * 2 + ["node 1, rank 2"] * 2
    # the launch's shared folder (checkpoints) is one for all nodes on this machine
    assert len({r["shared"] for r in ranks}) == 1
    assert {r["shared_holds"] for r in ranks} == {"rank 0"}


@pytest.mark.heavy  # nox -s heavy: two torchrun agents, 4 ranks, a crash and a hang (~70 s)
def test_a_rank_dying_on_node_1_is_a_crash_that_names_it(records):
    rec = records["exit_rank3-4x2"]
    assert rec.verdict == "crash", rec.line
    by_rank = {r.rank: r for r in rec.observed.ranks}
    assert by_rank[3].status == "crash" and by_rank[3].exit_code == 7, by_rank[3]
    assert "rank 3 died" in by_rank[3].error_message


@pytest.mark.heavy  # nox -s heavy: two torchrun agents, 4 ranks, a crash and a hang (~70 s)
def test_a_rank_hanging_on_node_1_is_a_hang_with_its_stack(records):
    rec = records["hang_rank2-4x2"]
    assert rec.verdict == "hang", rec.line
    hung = {r.rank: r for r in rec.observed.ranks if r.status == "hang"}
    assert 2 in hung, rec.observed.ranks
    assert "the stack dump must show this line" in hung[2].stack or "node_cells.py" in hung[2].stack


def test_a_layout_the_run_cannot_launch_is_skipped_with_one_line(tmp_path):
    launcher = Launcher(run_root=tmp_path / "launches", python=sys.executable)
    session = Session(load_matrix(MATRIX), launcher, tmp_path, {"torch": "2.13.0"}, repo_root=HERE)
    try:
        rec = session.run(_cells()["where-4x2"])
    finally:
        session.close()
    assert rec.verdict == "skipped"
    assert rec.observed.error_message.startswith("needs 4 ranks on 2 nodes (2 each) (its id's world size): ")
    assert "\n" not in rec.observed.error_message
    assert (rec.world_size, rec.nodes) == (4, 2)


def test_one_node_of_a_multi_machine_rendezvous_runs_only_its_own_layout():
    opts = LaunchOptions(torchrun_args="--nnodes=2 --node-rank=1 --rdzv-backend=c10d --rdzv-endpoint=h:1 --rdzv-id=x")
    assert layout_refusal(opts, "cpu", 4, 2) is None  # 2 ranks (--world-size) on each of the 2 nodes
    assert "one node of the 2-node rendezvous" in layout_refusal(opts, "cpu", 4, 1)
    assert "one node of the 2-node rendezvous" in layout_refusal(opts, "cpu", 8, 2)


def test_a_multi_node_launcher_makes_its_own_rendezvous(tmp_path):
    with pytest.raises(LaunchError, match="makes its own rendezvous"):
        Launcher(run_root=tmp_path, nodes=2, torchrun_args=["--nnodes=2", "--rdzv-endpoint=h:1"])


def test_share_gpu_lifts_the_gpu_per_rank_refusal_and_tells_the_ranks(monkeypatch, tmp_path):
    import torch

    from fsdp_matrix.runner.protocol import ENV_SHARE_GPU

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert "needs 2 GPUs on this machine (one per rank); it has 1" in layout_refusal(LaunchOptions(), "cuda", 2, 1)
    shared = LaunchOptions(share_gpu=True, device="cuda", world_size=2, results=tmp_path)
    assert layout_refusal(shared, "cuda", 2, 1) is None
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert "it has 0" in layout_refusal(shared, "cuda", 2, 1)  # sharing needs a GPU to share
    session = open_session(shared, load_matrix(), versions={})
    try:
        assert session.launcher.env[ENV_SHARE_GPU] == "1"
    finally:
        session.close()
