"""Tests for fsdp_matrix.export.trace: the traced run of a script on its ranks."""

from __future__ import annotations

import textwrap

import pytest

from fsdp_matrix.export.trace import can_trace, trace_script

SCRIPT = textwrap.dedent(
    """
    import os
    from dataclasses import dataclass

    from torch import distributed as dist

    PARAMS, PINS, DEVICE, WORLD_SIZE = {}, {}, "cpu", 2
    RankContext = dict


    @dataclass
    class Box:
        value: int = 0


    def run(params, ctx):
        box = [Box(7) if int(os.environ["RANK"]) == 0 else None]
        dist.broadcast_object_list(box, src=0)  # pickles the script's own class, as ram-efficient references do
        return box[0].value


    def rank_main(run, context_cls, params, pins, argv, device, ws):
        dist.init_process_group("gloo")
        try:
            value = run(params, None)
            if os.environ["RANK"] == "0":  # one writer: two ranks' prints interleave on the shared stdout
                print(f"===== outcome: rank 0 got {value}", flush=True)
        finally:
            dist.destroy_process_group()
        return 0
    """
)


@pytest.mark.skipif(not can_trace(), reason="needs torch, peft, transformers installed")
def test_an_object_of_the_scripts_own_class_crosses_ranks_under_the_tracer():
    trace = trace_script(SCRIPT, 2, "cpu", timeout=120)
    assert trace is not None and trace.outcome == "===== outcome: rank 0 got 7"
    assert not trace.raised and trace.lines
