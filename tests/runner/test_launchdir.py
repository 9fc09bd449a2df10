"""A launch directory read back: the ranks' events as whole lines, and torchrun's summary after it exited."""

from __future__ import annotations

import json

from fsdp_matrix.runner import launchdir
from fsdp_matrix.runner.protocol import LOGS, TORCHRUN_OUT, Ready, encode_event, events_file
from tests.runner.test_procs import SUMMARY


def test_events_are_read_as_whole_lines_and_a_half_written_one_waits(tmp_path):
    path = tmp_path / events_file(1)
    whole = encode_event(Ready(pid=7, t=1.0))
    path.write_text(whole + "\n" + whole[:10], encoding="utf-8")
    said, offset = launchdir.read_events(tmp_path, 1, 3, 0)
    assert [(s.rank, s.event) for s in said] == [(3, Ready(pid=7, t=1.0))]
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(whole[10:] + "\n")
    again, end = launchdir.read_events(tmp_path, 1, 3, offset)
    assert [s.event for s in again] == [Ready(pid=7, t=1.0)] and end == path.stat().st_size
    assert launchdir.read_events(tmp_path, 0, 0, 0) == ([], 0)  # no file yet


def test_an_end_that_cannot_be_read_is_that_ranks_error_and_other_garbage_is_left_out(tmp_path):
    bad_end = json.dumps({"event": "end", "key": "c/x", "result": {"rank": 0, "status": 1}, "t": 5.0})
    lines = ["not json", json.dumps({"event": "nonsense"}), bad_end]
    (tmp_path / events_file(0)).write_text("\n".join(lines) + "\n", encoding="utf-8")
    [said], _ = launchdir.read_events(tmp_path, 0, 0, 0)
    assert said.event.key == "c/x" and said.event.t == 5.0
    assert said.event.result.status == "error" and said.event.result.error_type == "fsdp_matrix.ProtocolError"


class _Exited:
    def __init__(self, code):
        self.code = code

    def poll(self):
        return self.code


def test_the_exit_reads_each_exited_nodes_summary_by_local_rank(tmp_path):
    nodes = [tmp_path / "n0", tmp_path / "n1"]
    for node in nodes:
        (node / LOGS).mkdir(parents=True)
    (nodes[1] / TORCHRUN_OUT).write_text(SUMMARY, encoding="utf-8")
    exited = launchdir.read_exit([(nodes[0], _Exited(None)), (nodes[1], _Exited(1))], 2, 1)
    assert exited.returncode == 1
    assert exited.running == {0: 0, 1: 0}  # node 0 still runs
    assert exited.codes == {2: -15, 3: -9} and exited.root == {3}  # node 1's local ranks 0, 1 are slots 2, 3
    assert exited.logs[3] == ("", None)
