"""Watching a live launch: the ranks' events in, one CellRun out per cell, whatever way the cell ended.

A cell ends in one of these ways, and each has one place here:

- every rank reported End and then Clean: ok or error (``_poll``);
- a rank raised and the others did not finish within ``grace_s``: error, the others' stacks (``_stuck``);
- no End from some rank within ``cell_timeout``: hang, the stacks of the ranks that did not finish (``_stuck``);
- every rank reported End, but one never reported Clean within ``cell_timeout`` (+ ``grace_s``): hang in the cleanup
  after the cell, with that rank's stack (``_stuck_in_cleanup``);
- torchrun exited: crash, told by the rank that died with its exit code or signal, whether it died in the cell or
  in the cleanup after it (``_crash``).

``Watching`` is the launcher's collaborator that reads; ``Launcher`` (launcher.py) starts and kills launches.
"""

from __future__ import annotations

import json
import signal
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable, Dict, List, Optional, Protocol, Tuple

from fsdp_matrix.clip import clip
from fsdp_matrix.records import RankResult
from fsdp_matrix.runner import procs
from fsdp_matrix.runner.live import CellRun, _Live  # noqa: F401 (re-exported: their home before the split)
from fsdp_matrix.runner.protocol import (
    LOGS,
    TORCHRUN_OUT,
    Bye,
    Clean,
    End,
    Hello,
    Ready,
    Start,
    decode_event,
    events_file,
)


class Settings(Protocol):
    """The launcher's settings that watching reads (read at each poll: a caller may change them between cells)."""

    world_size: int
    """Ranks per node."""
    nodes: int
    """Nodes (torchrun agents) this launcher starts; the ranks it watches are world_size x nodes."""
    cell_timeout: float
    grace_s: float
    startup_timeout: float


class Watching:
    """Reads a live launch's events and decides each cell's CellRun: the Launcher's collaborator that reads, while
    the Launcher starts and kills. It writes outcomes into ``done`` and asks ``replace`` to retire a launch."""

    def __init__(
        self,
        settings: Settings,
        done: Dict[str, CellRun],
        replace: Callable[[_Live, str], None],
        launch_seconds: List[float],
    ) -> None:
        self.settings = settings
        self._done = done
        self._replace = replace
        self.launch_seconds = launch_seconds

    @property
    def per_node(self) -> int:
        return self.settings.world_size

    @property
    def world_size(self) -> int:
        """Ranks this launcher watches: every rank of every node it started (a rank's slot is node x per_node +
        local rank: its global rank when this launcher started every node)."""
        return self.settings.world_size * getattr(self.settings, "nodes", 1)

    def where(self, live: _Live, slot: int) -> Tuple[Path, int]:
        """The run directory of the node that runs ``slot``, and the slot's local rank there."""
        node, local = divmod(slot, self.per_node)
        return live.agents[node][0], local

    @property
    def cell_timeout(self) -> float:
        return self.settings.cell_timeout

    @property
    def grace_s(self) -> float:
        return self.settings.grace_s

    @property
    def startup_timeout(self) -> float:
        return self.settings.startup_timeout

    # ---- events -------------------------------------------------------------------------------------------------
    def read_events(self, live: _Live) -> None:
        for rank in range(self.world_size):
            run_dir, local = self.where(live, rank)
            path = run_dir / events_file(local)
            if not path.exists():
                continue
            with open(path, encoding="utf-8") as fh:
                fh.seek(live.offsets.get(rank, 0))
                while True:
                    pos = fh.tell()
                    line = fh.readline()
                    if not line.endswith("\n"):
                        fh.seek(pos)  # half-written line: read it whole next time
                        break
                    self._apply(live, rank, line)
                live.offsets[rank] = fh.tell()

    def _apply(self, live: _Live, rank: int, line: str) -> None:
        try:
            event = decode_event(line)
        except (ValueError, TypeError, KeyError) as exc:  # pydantic's ValidationError is a ValueError
            self._unreadable(live, rank, line, exc)
            return
        getattr(self, f"worker_{event.event}")(live, rank, event)

    def _unreadable(self, live: _Live, rank: int, line: str, exc: Exception) -> None:
        """A line that is not a valid event. An End that fails validation is that rank's error for its cell (the
        cell gets an outcome, the launch goes on); any other such line is left out: the cell it belongs to is
        decided by what follows (its End, or the cell timeout)."""
        try:
            data = json.loads(line)
        except ValueError:
            return
        if isinstance(data, dict) and data.get("event") == "end" and isinstance(data.get("key"), str):
            message = f"rank {rank}'s result for the cell could not be read: {clip(str(exc), 300, flat=True)}"
            result = RankResult(
                rank=rank, status="error", error_type="fsdp_matrix.ProtocolError", error_message=message
            )
            t = data.get("t")
            self.worker_end(
                live, rank, End(key=data["key"], result=result, t=t if isinstance(t, float) else time.time())
            )

    # one handler per rank event, as pytest-xdist's scheduler dispatches worker_<event>
    def worker_hello(self, live: _Live, rank: int, ev: Hello) -> None:
        live.pids[rank] = (ev.pid, ev.create_time)

    def worker_ready(self, live: _Live, rank: int, ev: Ready) -> None:
        live.ready.add(rank)
        if len(live.ready) == self.world_size:
            self.launch_seconds.append(round(time.monotonic() - live.born, 3))

    def worker_start(self, live: _Live, rank: int, ev: Start) -> None:
        live.started.setdefault(ev.key, {})[rank] = ev.t

    def worker_end(self, live: _Live, rank: int, ev: End) -> None:
        live.ended.setdefault(ev.key, {})[rank] = ev.result
        live.end_t[ev.key] = max(live.end_t.get(ev.key, 0.0), ev.t)

    def worker_clean(self, live: _Live, rank: int, ev: Clean) -> None:
        live.clean.setdefault(ev.key, {})[rank] = list(ev.problems)
        if not ev.clean:
            live.retiring = f"rank {rank} not clean after {ev.key}: " + "; ".join(ev.problems)

    def worker_bye(self, live: _Live, rank: int, ev: Bye) -> None:
        live.byes.add(rank)
        if ev.retire:
            live.retiring = ev.why

    # ---- deciding -----------------------------------------------------------------------------------------------
    def poll(self, live: _Live) -> None:
        # exit first, events second: an exited launch's last words are all on disk by now
        exited = live.exited()
        self.read_events(live)
        for key, ends in list(live.ended.items()):
            if (
                key not in self._done
                and len(ends) == self.world_size
                and len(live.clean.get(key, {})) == self.world_size
            ):
                self._finish(live, key, "error" if any(r.status == "error" for r in ends.values()) else "ok")
        # cells run in order, so the oldest unfinished one is the culprit; later ones are just re-queued
        current = [k for k in live.submitted if k in live.started and k not in self._done][:1]
        now = time.time()
        for key in current:
            first = min(live.started[key].values())
            ends = live.ended.get(key, {})
            errored = [r for r in ends.values() if r.status == "error"]
            limit = live.timeouts.get(key, self.cell_timeout)
            # the ranks' barrier after a cell waits min(30, cell_timeout) (launcher.py), whatever the cell's own limit
            cleanup = max(limit, min(30.0, self.cell_timeout))
            if exited:
                self._crash(live, key)
            elif len(ends) == self.world_size:
                # past the ranks' own barrier timeout: the healthy ones have reported by then
                if now - live.end_t[key] > cleanup + self.grace_s:
                    self._stuck_in_cleanup(live, key, cleanup)
            elif errored and now - live.end_t[key] > self.grace_s:
                self._stuck(
                    live, key, "error", live.end_t[key], f"rank {errored[0].rank} raised; the others did not finish"
                )
            elif now - first > limit:
                self._stuck(live, key, "hang", first + limit, f"no result within {limit:g}s")
        if live.gone:
            return
        idle = all(k in self._done for k in live.started)
        if exited:
            code = live.returncode()
            if code == 0 and not live.retiring and all(k in self._done for k in live.submitted):
                self._replace(live, "")  # every rank said goodbye: nothing failed, nothing to re-run
                return
            self._replace(live, live.retiring or f"torchrun exited with {code}")
        elif live.retiring and idle:
            self._replace(live, live.retiring)
        elif len(live.ready) < self.world_size and time.monotonic() - live.born > self.startup_timeout:
            self._replace(live, f"ranks did not rendezvous within {self.startup_timeout:.0f}s")

    def _finish(
        self,
        live: _Live,
        key: str,
        status: str,
        extra: Optional[List[RankResult]] = None,
        detect_s: Optional[float] = None,
        note: str = "",
    ) -> None:
        """Record the cell's CellRun. ``extra`` results override what a rank reported: a rank that died or hung in
        the cleanup after its End is told by what happened after, not by its End."""
        ranks = dict(live.ended.get(key, {}))
        ranks.update({r.rank: r for r in extra or []})
        start = min(live.started.get(key, {0: time.time()}).values())
        end = live.end_t.get(key, time.time()) if status in ("ok", "error") and not extra else time.time()
        problems = sorted(
            {p for ps in live.clean.get(key, {}).values() for p in ps if p != "another rank is not clean"}
        )
        self._done[key] = CellRun(
            key=key,
            status=status,
            ranks=[ranks[r] for r in sorted(ranks)],
            duration_s=round(end - start, 3),
            launch=live.number,
            detect_s=detect_s,
            # a rank that is not clean retires the launch: the next cell runs in fresh ranks, never in this process
            note=note or ("; ".join(problems) + "; ranks restarted before the next cell" if problems else ""),
            hygiene=problems,
            env_removed=list(live.env_removed),
        )

    def _dump_stacks(self, live: _Live, ranks: Dict[int, Tuple[int, float]]) -> Dict[int, str]:
        """procs.dump_stacks, node by node: each node's ranks dump into its own directory, by local rank."""
        out: Dict[int, str] = {}
        for node, (run_dir, _) in enumerate(live.agents):
            here = {
                local: ranks[slot]
                for slot in ranks
                for local in [slot - node * self.per_node]
                if 0 <= local < self.per_node
            }
            if here:
                dumped = procs.dump_stacks(here, run_dir)
                out.update({node * self.per_node + local: text for local, text in dumped.items()})
        return out

    def _stuck(self, live: _Live, key: str, status: str, since: float, note: str) -> None:
        """Some ranks did not finish the cell: dump their stacks (for a hang, every rank's: where the finished ones
        wait is what the stuck one owes them), then kill the launch."""
        ended = live.ended.get(key, {})
        missing = {r: ident for r, ident in live.pids.items() if r not in ended}
        stacks = self._dump_stacks(live, dict(live.pids) if status == "hang" else missing)
        what = "did not finish after another rank raised" if status == "error" else "did not finish the cell"
        extra = [
            RankResult(
                rank=r,
                status="hang",
                error_message=f"rank {r} {what} ({note})",
                stack=stacks.get(r) or "(no stack dumped)",
            )
            for r in missing
        ]
        if status == "hang":
            extra += [replace(ended[r], stack=stacks.get(r) or "(no stack dumped)") for r in ended if r in live.pids]
        self._finish(live, key, status, extra, detect_s=round(time.time() - since, 3), note=note)
        self._replace(live, note)

    def _stuck_in_cleanup(self, live: _Live, key: str, limit: float) -> None:
        """Every rank ended the cell, but some never reported Clean: hung in the cleanup after the cell. The cell
        is a hang (it must not pass: the launch is gone), told by the stuck ranks with their stacks."""
        stuck = {r: ident for r, ident in live.pids.items() if r not in live.clean.get(key, {})}
        stacks = self._dump_stacks(live, stuck)
        note = (
            f"hung in cleanup after the cell: rank(s) {', '.join(map(str, sorted(stuck)))} reported their result "
            f"but not their cleanup within {limit + self.grace_s:.0f}s"
        )
        extra = [
            replace(
                live.ended[key][r],
                status="hang",
                error_message=f"rank {r} hung in the cleanup after the cell (its own result was "
                f"{live.ended[key][r].status})",
                stack=stacks.get(r) or "(no stack dumped)",
            )
            for r in stuck
        ]
        since = live.end_t[key] + limit + self.grace_s
        self._finish(live, key, "hang", extra, detect_s=round(time.time() - since, 3), note=note)
        self._replace(live, note)

    def _crash(self, live: _Live, key: str) -> None:
        """torchrun exited while ``key`` was unfinished. The rank that died speaks for the cell, with its exit code
        or signal: torchrun's root cause, or any rank that died of something other than torchrun's own SIGTERM.
        The ranks torchrun stopped after it are "stopped". A rank that had already reported End died in the cleanup
        after the cell, and its End does not make the cell pass."""
        codes: Dict[int, int] = {}
        root: set = set()
        running: Dict[int, int] = {}  # slot -> its node, for ranks whose node's torchrun is still up
        for node, (run_dir, proc) in enumerate(live.agents):
            first = node * self.per_node
            if proc.poll() is None:
                running.update({first + local: node for local in range(self.per_node)})
                continue
            log = (run_dir / TORCHRUN_OUT).read_text(errors="replace")
            # by local rank, so that a node started with --node-rank k reads its own ranks as its slots
            codes.update({first + r: c for r, c in procs.torchrun_failures(log, local=True).items()})
            root.update(first + r for r in procs.torchrun_root_cause(log, local=True))
        died = {r for r, code in codes.items() if r in root or code != -signal.SIGTERM}
        culprits = ", ".join(f"rank {r}" for r in sorted(died)) or "a rank"
        ended = live.ended.get(key, {})
        extra = []
        for rank in range(self.world_size):
            code = codes.get(rank)
            if rank in ended and rank not in died:
                continue  # it finished the cell and was only stopped afterwards: its End stands
            run_dir, local = self.where(live, rank)
            stderr, error_file = procs.rank_logs(run_dir / LOGS, local)
            how = dict(exit_code=code, signal=procs.signal_name(code), traceback=error_file, stack=stderr)
            if rank in running and rank not in ended:
                message = f"rank {rank} was still running on node {running[rank]} when another node's torchrun exited"
                extra.append(RankResult(rank=rank, status="stopped", error_message=message + f" ({culprits} died)"))
                continue
            if rank in ended:
                message = f"rank {rank} died in the cleanup after the cell, {_death(code)} (its own result was "
                extra.append(
                    replace(ended[rank], status="crash", error_message=message + f"{ended[rank].status})", **how)
                )
            elif rank in died:
                extra.append(
                    RankResult(rank=rank, status="crash", error_message=f"rank {rank} died {_death(code)}", **how)
                )
            elif codes:
                message = f"rank {rank} was stopped by torchrun after {culprits} died" + (
                    f" ({_death(code)})" if code is not None else ""
                )
                extra.append(RankResult(rank=rank, status="stopped", error_message=message, **how))
            else:
                message = f"rank {rank} is gone, exit code unknown (torchrun exited with {live.returncode()})"
                extra.append(RankResult(rank=rank, status="crash", error_message=message, **how))
        # a rank that died takes precedence: the others' errors ("connection closed by peer") are its echo
        status = "crash" if any(r.status == "crash" for r in extra) else "error"
        self._finish(
            live,
            key,
            status,
            extra,
            detect_s=round(time.time() - max(live.started[key].values()), 3),
            note=f"torchrun exited with {live.returncode()}",
        )


def _death(code: Optional[int]) -> str:
    name = procs.signal_name(code)
    return f"with exit code {code}" + (f" ({name})" if name else "")
