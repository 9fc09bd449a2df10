"""A launch's directory, and what becomes of it: orders written in, the ranks' events and torchrun's logs read out.

While the launch runs, the launcher writes ``launch.json`` (settings, and who its coordinator is) and the numbered
task files there; the ranks write their events, stack dumps and torchrun's logs. When it ends, a clean launch's
directory is removed; a failed one (hang, crash, killed, never started) is kept for inspection, but only the newest
``keep`` of those under one ``run_root`` (older ones go, including those of earlier runs whose coordinator is gone).
A directory whose coordinator still runs is never touched: it may be a concurrent run's live launch.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

import psutil

from fsdp_matrix.clip import clip
from fsdp_matrix.records import RankResult
from fsdp_matrix.runner import procs
from fsdp_matrix.runner.protocol import (
    LAUNCH_JSON,
    LOGS,
    NODE_DIR,
    RETIRED,
    SCRATCH,
    SHARED,
    TASKS,
    TORCHRUN_OUT,
    End,
    LaunchConfig,
    Order,
    decode_event,
    encode_config,
    encode_order,
    events_file,
    task_file,
)
from fsdp_matrix.runner.watching import Exited, Said

ORPHAN_AGE_S = 3600.0
"""A directory with no launch.json (a coordinator killed while creating it) is prunable after this long."""


def create(run_root: Path, number: int, launch_id: str, shared: Optional[str] = None, **settings: Any) -> Path:
    """``run_root/launch-<number>-<launch_id>`` with its task folder, scratch folder, the folder all its nodes share
    and launch.json (``settings``: the LaunchConfig fields other than the folders and the coordinator, which this
    fills in). ``shared``: None makes the launch's own (``shared/`` in it); a path (a folder on shared storage, for
    one node of a rendezvous of several machines) or "" (none) is handed on as it is."""
    run_dir = Path(run_root) / f"launch-{number}-{launch_id}"
    (run_dir / TASKS).mkdir(parents=True)
    if shared is None:
        (run_dir / SHARED).mkdir()
        shared = str(run_dir / SHARED)
    _configure(run_dir, shared, **settings)
    return run_dir


def create_node(run_dir: Path, node: int, **settings: Any) -> Path:
    """Node ``node``'s own directory inside the launch directory ``run_dir`` (a multi-node launch on this machine):
    its tasks, events and scratch, as on a host of its own; only the launch's shared folder is common."""
    node_dir = run_dir / NODE_DIR.format(node)
    (node_dir / TASKS).mkdir(parents=True)
    _configure(node_dir, str(run_dir / SHARED), **settings)
    return node_dir


def _configure(run_dir: Path, shared: str, **settings: Any) -> None:
    (run_dir / SCRATCH).mkdir()
    me = psutil.Process()
    config = LaunchConfig(
        scratch=str(run_dir / SCRATCH),
        shared=shared,
        coordinator=me.pid,
        coordinator_create_time=me.create_time(),
        **settings,
    )
    tmp = run_dir / f".{LAUNCH_JSON}.tmp"
    tmp.write_text(encode_config(config))
    os.replace(tmp, run_dir / LAUNCH_JSON)  # a rank or a pruner never reads half of it


def write_order(run_dir: Path, seq: int, order: Order) -> None:
    """Task file number ``seq``, written atomically: a rank never reads half a task."""
    tasks = run_dir / TASKS
    tmp = tasks / f".{task_file(seq)}.tmp"
    tmp.write_text(encode_order(order))
    os.replace(tmp, tasks / task_file(seq))


def retire(run_dir: Path, failed: Optional[str], keep_all: bool, keep: int) -> None:
    """The launch is over: remove a clean one's directory (unless ``keep_all``); mark a failed one with ``failed``
    (the reason) and prune the failed ones under the same root to the newest ``keep``."""
    if failed is None:
        if not keep_all:
            shutil.rmtree(run_dir, ignore_errors=True)
        return
    try:
        (run_dir / RETIRED).write_text(failed + "\n")
    except OSError:
        return  # the directory is gone already: nothing to keep or prune
    if not keep_all:
        prune(run_dir.parent, keep)


def prune(run_root: Path, keep: int) -> List[Path]:
    """Remove all but the newest ``keep`` finished launch directories under ``run_root``; returns those removed."""
    over = [d for d in Path(run_root).glob("launch-*") if d.is_dir() and _finished(d)]
    over.sort(key=_mtime, reverse=True)
    for old in over[keep:]:
        shutil.rmtree(old, ignore_errors=True)
    return over[keep:]


def _finished(run_dir: Path) -> bool:
    if (run_dir / RETIRED).exists():
        return True
    try:
        # only the coordinator matters here, so a launch.json of another harness version is read too
        data = json.loads((run_dir / LAUNCH_JSON).read_text())
        pid, created = data["coordinator"], data.get("coordinator_create_time")
    except (OSError, ValueError, TypeError, KeyError):  # not written yet, or not ours
        return time.time() - _mtime(run_dir) > ORPHAN_AGE_S
    if not isinstance(created, (int, float)):
        return not psutil.pid_exists(pid)
    return procs.same_process(pid, created) is None


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def read_events(run_dir: Path, local: int, slot: int, offset: int) -> Tuple[List[Said], int]:
    """The whole lines of rank ``local``'s events file from ``offset`` on, as events of ``slot``, and the offset to
    read on from (a half-written line is read whole next time)."""
    path = run_dir / events_file(local)
    if not path.exists():
        return [], offset
    said: List[Said] = []
    with open(path, encoding="utf-8") as fh:
        fh.seek(offset)
        while True:
            pos = fh.tell()
            line = fh.readline()
            if not line.endswith("\n"):
                fh.seek(pos)
                break
            said += _event(slot, line)
        return said, fh.tell()


def _event(slot: int, line: str) -> List[Said]:
    """One line as an event. An End that fails validation is that rank's error for its cell (the cell gets an
    outcome, the launch goes on); any other line that is not a valid event is left out: the cell it belongs to is
    decided by what follows (its End, or the cell timeout)."""
    try:
        return [Said(slot, decode_event(line))]
    except (ValueError, TypeError, KeyError) as exc:  # pydantic's ValidationError is a ValueError
        try:
            data = json.loads(line)
        except ValueError:
            return []
        if not (isinstance(data, dict) and data.get("event") == "end" and isinstance(data.get("key"), str)):
            return []
        message = f"rank {slot}'s result for the cell could not be read: {clip(str(exc), 300, flat=True)}"
        result = RankResult(rank=slot, status="error", error_type="fsdp_matrix.ProtocolError", error_message=message)
        t = data.get("t")
        return [Said(slot, End(key=data["key"], result=result, t=t if isinstance(t, float) else time.time()))]


def read_exit(agents: Sequence[Tuple[Path, subprocess.Popen]], per_node: int, returncode: Optional[int]) -> Exited:
    """What the torchrun agents that exited say (their summaries, by local rank, so that a node started with
    ``--node-rank k`` reads its own ranks as its slots), and each rank's logs."""
    codes: Dict[int, int] = {}
    root: Set[int] = set()
    running: Dict[int, int] = {}
    logs: Dict[int, Tuple[str, Optional[str]]] = {}
    for node, (run_dir, proc) in enumerate(agents):
        first = node * per_node
        logs.update({first + local: procs.rank_logs(run_dir / LOGS, local) for local in range(per_node)})
        if proc.poll() is None:
            running.update({first + local: node for local in range(per_node)})
            continue
        log = (run_dir / TORCHRUN_OUT).read_text(errors="replace")
        codes.update({first + r: c for r, c in procs.torchrun_failures(log, local=True).items()})
        root.update(first + r for r in procs.torchrun_root_cause(log, local=True))
    return Exited(returncode, codes, frozenset(root), running, logs)
