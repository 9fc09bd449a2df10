"""One launch's processes: its rendezvous options, and a kill that does not take is an error."""

from __future__ import annotations

import subprocess

import pytest

from fsdp_matrix.errors import LaunchError
from fsdp_matrix.runner import launch as launch_mod
from fsdp_matrix.runner import launcher
from fsdp_matrix.runner.launch import Launch, LaunchSpec
from fsdp_matrix.runner.watching import LaunchState


def test_the_old_import_names_the_same_launch():
    assert launcher.Launch is Launch and launcher.KILL_WAIT_S == launch_mod.KILL_WAIT_S
    assert issubclass(launcher.Launcher, LaunchSpec)


def test_a_one_node_launch_takes_the_callers_rendezvous_and_several_nodes_make_their_own():
    assert launch_mod._rendezvous(LaunchSpec(torchrun_args=["--standalone"]), 0, "id", 0) == ["--standalone"]
    two = LaunchSpec(nodes=2)
    host, guest = (launch_mod._rendezvous(two, node, "abc", 29500) for node in (0, 1))
    assert "--rdzv-endpoint=127.0.0.1:29500" in host and host == [
        a.replace("node-rank=1", "node-rank=0").replace("is_host=0", "is_host=1") for a in guest
    ]
    assert "--rdzv-conf=is_host=1" in host and "--node-rank=1" in guest


def test_a_launch_reads_and_dumps_by_slot_across_its_nodes(tmp_path):
    """Slot = node x world_size + local rank: ranks 2 and 3 of a 2x2 launch are node 1's ranks 0 and 1."""
    live = Launch(tmp_path, None, "x", LaunchState(number=0, born=0.0), world_size=2)
    live.more_agents = [(tmp_path / "n1", None)]
    assert [d for d, _ in live.agents] == [tmp_path, tmp_path / "n1"]
    assert live.read_events() == [] and sorted(live.offsets) == [0, 1, 2, 3]


def test_a_kill_that_does_not_take_is_an_error(tmp_path):
    done = subprocess.Popen(["true"])
    done.wait()

    class Unkillable:
        pid = done.pid
        returncode = None

        def wait(self, timeout=None):
            raise subprocess.TimeoutExpired("torchrun", timeout)

        def poll(self):
            return None

    live = Launch(tmp_path, Unkillable(), "unkillable01", LaunchState(number=0, born=0.0))
    with pytest.raises(LaunchError, match=f"{Unkillable.pid}.*still running"):
        live.kill()
