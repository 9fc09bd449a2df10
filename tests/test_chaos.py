"""Chaos: real runs of real cells (``python -m fsdp_matrix run``, as a user runs it) under injected faults, each
followed by ``--resume`` runs until every cell has its record. After every fault:

- no process of the run survives (the launch marker, ``procs.MARKER``, or the results folder in its command line);
- nothing is left in the runs' temp folder (``TMPDIR`` of every run points at a folder of this test), except a
  library's own cross-run cache (LIBRARY_CACHES);
- no record that could once be read is lost, and ``python -m fsdp_matrix report`` reads the file;

and once the resume runs complete, every cell has exactly one well-formed final record, and no more launch folders
remain than the launcher keeps for inspection.

Faults: SIGKILL of the run at random points (seeded: the seed is printed; ``FSDP_MATRIX_CHAOS_SEED=N`` replays a
schedule, ``FSDP_MATRIX_CHAOS_KILLS`` sets how many), a torn final line in cells.jsonl, a rank SIGKILLed mid-cell, a
rank hung in C code holding the GIL, and the run SIGKILLed while a rank hangs in C code. The cells are fault cells
from tests/runner/fault_cells.py and, in the heavy tier, the matrix's no-split-modules cells.

Two tiers (``TIERS``): ``nox -s tests`` runs every kind of fault with 2 random kills over 4 cheap fault cells (a
collective and a 1 s sleep); ``nox -s heavy`` (marker ``heavy``) runs 10 random kills over the 12 no-split-modules
cells, which train for real.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Set, Tuple

import psutil
import pytest
import yaml

from fsdp_matrix import records
from fsdp_matrix.cells import expand
from fsdp_matrix.matrix import DEFAULT_MATRIX, load_matrix
from fsdp_matrix.report import cli as report_cli
from fsdp_matrix.runner import procs
from fsdp_matrix.runner.launcher import Launcher
from fsdp_matrix.runner.protocol import stripped
from fsdp_matrix.runner.session import resumable

HERE = Path(__file__).resolve().parent
SEED = int(os.environ.get("FSDP_MATRIX_CHAOS_SEED") or random.SystemRandom().randrange(2**31))


@dataclass(frozen=True)
class Tier:
    """How hard one chaos run pushes: the random kills, and over which cells."""

    kills: int
    """SIGKILLs of the run at random points, in rounds of ``per_round``."""
    per_round: int
    """SIGKILLs before a round's resume runs to completion (each round starts from an empty results folder)."""
    real_cells: bool
    """The matrix's 12 no-split-modules cells (real training: every rank of every run imports peft and transformers,
    about 8 s of CPU each); else 4 cells of tests/runner/fault_cells.py that run a collective and sleep 1 s (their
    ranks import torch alone). What the test holds the runner to is the same: every record, once, no process left."""


TIERS = {
    "tests": Tier(kills=int(os.environ.get("FSDP_MATRIX_CHAOS_KILLS") or 2), per_round=2, real_cells=False),
    "heavy": Tier(kills=10, per_round=5, real_cells=True),
}
"""``nox -s tests``'s budget holds 2 kills in one round over 4 cheap cells, each round a resume to completion after its
kills (FSDP_MATRIX_CHAOS_KILLS sets more); ``nox -s heavy`` kills 10 times over the 12 real no-split-modules cells."""
CELL_TIMEOUT_S = 10
"""Per-cell timeout of the runs: bounds the injected C hang; generous for the cheap cells on a loaded machine."""
GONE_WITHIN_S = 30.0
"""Generous bound for a killed run's launch (watchdog included) to be gone: proves it goes, not how fast."""
RUN_TIMEOUT_S = 900
LIBRARY_CACHES = ("torchinductor_",)
"""Folders a library keeps in the temp folder across runs on purpose (torch's compile cache, one per user): not
a run's leftovers. Everything else the runs put there must be gone."""
SLEEPY = "chaos-faults/fault_ok-sleep2-ws2"
HANG_C = ["chaos-faults/fault_hang_c_once_rank1-n1-ws2", "chaos-faults/fault_hang_c_once_rank1-n2-ws2"]
Identity = Tuple[Optional[str], str, float]


def _chaos_matrix(folder: Path) -> Path:
    """matrix.yaml's no-split-modules case, plus the fault cells, with absolute repro paths."""
    repo = yaml.safe_load(DEFAULT_MATRIX.read_text())
    nosplit = next(c for c in repo["cases"] if c["id"] == "no-split-modules")
    nosplit["repro"] = str(DEFAULT_MATRIX.parent / nosplit["repro"])
    faults = {
        "id": "chaos-faults",
        "title": "cells the chaos test hurts",
        "report": "chaos test",
        "repro": str(HERE / "runner" / "fault_cells.py"),
        "grids": [
            {"fault": ["ok"], "sleep": [2]},
            {"fault": ["hang_c_once_rank1"], "n": [1, 2]},
            {"fault": ["ok"], "n": list(range(1, 5)), "sleep": [1]},
        ],
        "expect": [{"ok": True, "source": "a healthy cell trains; the hang is transient"}],
    }
    combo = {"id": "chaos", "pins": repo["combos"][0]["pins"]}
    path = folder / "chaos-matrix.yaml"
    doc = {"errors": repo.get("errors", {}), "combos": [combo], "cases": [nosplit, faults]}  # the named signatures too
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


class Chaos:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.tmp = root / "tmp"
        self.flags = root / "flags"
        for folder in (self.tmp, self.flags, root / "logs"):
            folder.mkdir()
        self.matrix = _chaos_matrix(root)
        self.nosplit = [c.key for c in expand(load_matrix(self.matrix), cases=["no-split-modules"])]
        self.cheap = [c.key for c in expand(load_matrix(self.matrix), cases=["chaos-faults"]) if "-sleep1" in c.key]
        self.faults: Counter = Counter()
        self.orphans = 0
        self.temp_left: List[str] = []
        self.lost: Set[Identity] = set()
        self.skipped_lines: Set[Tuple[str, int]] = set()
        self.seen: Dict[Path, Set[Identity]] = {}
        self.runs = 0
        self.launch_ids: Set[str] = set()

    # ---- running ------------------------------------------------------------------------------------------------
    def start(
        self, results: Path, cells: List[str], matrix: Optional[Path] = None, env: Optional[Dict[str, str]] = None
    ) -> subprocess.Popen:
        """A run of ``cells`` (in this order) of ``matrix`` (default: the chaos matrix), with ``env`` added to the
        caller's environment."""
        self.runs += 1
        cmd = [sys.executable, "-m", "fsdp_matrix", "run", *cells, "--matrix", str(matrix or self.matrix)]
        cmd += ["--results", str(results), "--combo", "chaos", "--cell-timeout", str(CELL_TIMEOUT_S), "--resume"]
        env = {**os.environ, **(env or {}), "TMPDIR": str(self.tmp), "FSDP_MATRIX_CHAOS_DIR": str(self.flags)}
        env.setdefault("OMP_NUM_THREADS", "1")
        with open(self.root / "logs" / f"run-{self.runs:03d}.log", "w") as log:
            return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def log(self) -> str:
        return (self.root / "logs" / f"run-{self.runs:03d}.log").read_text(errors="replace")[-4000:]

    def kill(self, proc: subprocess.Popen) -> None:
        os.kill(proc.pid, signal.SIGKILL)  # the run alone, as the OOM killer or `kill -9 <pytest>` would
        proc.wait()

    def complete(self, results: Path, cells: List[str]) -> None:
        """``--resume`` to completion, then every check, and every cell's one final record."""
        proc = self.start(results, cells)
        rc = proc.wait(timeout=RUN_TIMEOUT_S)
        assert rc in (0, 1), f"run exited {rc}:\n{self.log()}"  # 1: some verdict failed, which chaos may cause
        recs = self.settle(results)
        for key in cells:
            mine = [r for r in recs if r.key == key]
            final = [r for r in mine if resumable(r)]
            assert len(final) == 1, (key, [r.verdict for r in mine], self.log())
            assert max(mine, key=lambda r: r.finished_at) is final[0], (key, [r.verdict for r in mine])
        launches = list((results / "launches" / "cli").glob("launch-*"))
        assert len(launches) <= Launcher(run_root=results).keep_failed, sorted(d.name for d in launches)

    # ---- checking -----------------------------------------------------------------------------------------------
    def settle(self, results: Path) -> List[records.Record]:
        """After a run ended or was killed: its processes are gone, its temp files too, no record was lost."""
        self.launch_ids |= procs.launch_ids_under(results)
        deadline = time.monotonic() + GONE_WITHIN_S
        while (alive := self._alive(results)) and time.monotonic() < deadline:
            time.sleep(0.25)
        if alive:
            self.orphans += len(alive)
            print(f"ORPHANS after run {self.runs}: {[(p.pid, _cmd(p)) for p in alive]}")
            procs.kill_all(alive)
        left = sorted(p.name for p in self.tmp.iterdir() if not p.name.startswith(LIBRARY_CACHES))
        if left:
            self.temp_left += left
            print(f"TEMP LEFT after run {self.runs}: {left}")
        skipped: List[records.Skipped] = []
        file = results / records.RECORDS_FILE
        recs = list(records.iter_records(file, skipped)) if file.exists() else []
        self.skipped_lines |= {(str(s.file), s.line) for s in skipped}
        now = {(r.run_id, r.key, r.finished_at) for r in recs}
        seen = self.seen.setdefault(results, set())
        self.lost |= seen - now
        seen |= now
        if recs:
            out = self.root / "report"
            assert report_cli.main([str(results), "--out", str(out), "--format", "text", "--format", "json"]) == 0
            assert len(json.loads((out / "report.json").read_text())["rows"]) == len({r.key for r in recs})
        return recs

    def _alive(self, results: Path) -> List[psutil.Process]:
        ids = self.launch_ids | procs.launch_ids_under(results)
        found = []
        for proc in psutil.process_iter():
            try:
                if proc.environ().get(procs.MARKER) in ids or str(results / "launches") in " ".join(proc.cmdline()):
                    found.append(proc)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        return found

    def rank_event(self, results: Path, rank: int, key: str, proc: subprocess.Popen) -> Tuple[int, float]:
        """Wait until ``rank`` started ``key``; its (pid, create time) from its Hello."""
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while time.monotonic() < deadline and proc.poll() is None:
            for events in (results / "launches" / "cli").glob(f"launch-*/rank{rank}.jsonl"):
                lines = [_json(line) for line in events.read_text().splitlines(keepends=True) if line.endswith("\n")]
                if any(e.get("event") == "start" and e.get("key") == key for e in lines):
                    hello = next(e for e in lines if e.get("event") == "hello")
                    return hello["pid"], hello["create_time"]
            time.sleep(0.1)
        raise AssertionError(f"rank {rank} never started {key} (run exited {proc.poll()}):\n{self.log()}")

    def figures(self, wall_s: float) -> str:
        kinds = ", ".join(f"{n} {k}" for k, n in self.faults.items())
        return (
            f"chaos: seed {SEED} (replay: FSDP_MATRIX_CHAOS_SEED={SEED}); faults injected {sum(self.faults.values())}"
            f" ({kinds}); records lost {len(self.lost)}; orphans {self.orphans}; temp files left "
            f"{len(self.temp_left)}; torn lines skipped and reported {len(self.skipped_lines)}; {self.runs} runs; "
            f"wall {wall_s:.0f}s"
        )


def _json(line: str) -> dict:
    try:
        return json.loads(line)
    except ValueError:
        return {}


def _cmd(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline())[:160]
    except psutil.Error:
        return "?"


def _random_kills(chaos: Chaos, rng: random.Random, tier: Tier, cells: List[str]) -> Path:
    """SIGKILL of the run at random points, across runs, each round resumed to completion; the last round's results."""
    window = 15.0  # seconds; then the time a resume took to complete, so kills land across a whole run
    rounds = 0
    while chaos.faults["SIGKILL of the run"] < tier.kills:
        rounds += 1
        assert rounds <= 2 * tier.kills, "kills keep missing their runs"
        results = chaos.root / f"round{rounds}"
        for _ in range(tier.per_round):
            if chaos.faults["SIGKILL of the run"] >= tier.kills:
                break
            proc = chaos.start(results, cells)
            began = time.monotonic()
            try:
                proc.wait(timeout=rng.uniform(0.1, window))
                window = max(1.0, time.monotonic() - began)  # it finished first: aim earlier next time
            except subprocess.TimeoutExpired:
                chaos.kill(proc)
                chaos.faults["SIGKILL of the run"] += 1
            chaos.settle(results)
        began = time.monotonic()
        chaos.complete(results, cells)
        window = max(window, time.monotonic() - began + 2.0)
    return results


def _torn_line_then_rank_killed(chaos: Chaos, results: Path, cells: List[str]) -> List[str]:
    """A torn final line in cells.jsonl, then a run that resumes it and loses a rank to SIGKILL mid-cell."""
    file = results / records.RECORDS_FILE
    lines = file.read_bytes().splitlines(keepends=True)
    torn = lines[-1][: len(lines[-1]) // 2]
    file.write_bytes(b"".join(lines[:-1]) + torn)
    chaos.faults["torn final line"] += 1
    chaos.seen[results] = {(r.run_id, r.key, r.finished_at) for r in records.iter_records(file, [])}  # not a loss
    # the torn cell runs again first (its record must not be glued onto the fragment), then the sleepy one
    cells = cells + [SLEEPY]
    proc = chaos.start(results, cells)
    pid, created = chaos.rank_event(results, 1, SLEEPY, proc)
    time.sleep(0.5)  # inside the cell's 2 s sleep
    rank = procs.same_process(pid, created)
    assert rank is not None, "rank 1 ended before it could be killed"
    rank.kill()
    chaos.faults["rank SIGKILLed mid-cell"] += 1
    assert proc.wait(timeout=RUN_TIMEOUT_S) == 1, chaos.log()
    after = chaos.settle(results)
    crash = [r for r in after if r.key == SLEEPY][-1]
    assert crash.verdict == "crash" and "SIGKILL" in crash.observed.error_message, crash.observed
    assert file.read_bytes().startswith(b"".join(lines[:-1]) + torn + b"\n"), "a record was glued onto the fragment"
    chaos.complete(results, cells)
    return cells


def _hangs_in_c(chaos: Chaos, results: Path, cells: List[str]) -> None:
    """A rank hung in C code (holding the GIL); then a run that resumes that cell and is SIGKILLed while another
    cell's rank hangs in C."""
    cells = cells + HANG_C[:1]
    proc = chaos.start(results, cells)
    chaos.faults["rank hung in C code"] += 1
    assert proc.wait(timeout=RUN_TIMEOUT_S) == 1, chaos.log()
    hang = [r for r in chaos.settle(results) if r.key == HANG_C[0]][-1]
    assert hang.verdict == "hang", hang.observed
    assert "fault_cells.py" in next(r.stack for r in hang.observed.ranks if r.rank == 1)
    # the hang is transient: this run's resume trains HANG_C[0], then is killed inside HANG_C[1]'s hang
    cells = cells + HANG_C[1:]
    proc = chaos.start(results, cells)
    chaos.rank_event(results, 1, HANG_C[1], proc)
    time.sleep(1.0)  # rank 1 is in its C sleep now
    chaos.kill(proc)
    chaos.faults["SIGKILL of the run while a rank hangs in C"] += 1
    chaos.settle(results)
    chaos.complete(results, cells)


@pytest.mark.timeout(3600)
@pytest.mark.parametrize("tier", [pytest.param("tests"), pytest.param("heavy", marks=pytest.mark.heavy)])
def test_chaos(tmp_path, capsys, tier):
    start = time.monotonic()
    rng = random.Random(SEED)
    spec = TIERS[tier]
    with capsys.disabled():
        print(f"\nchaos ({tier}): seed {SEED}, {spec.kills} SIGKILLs of the run at random points")
    chaos = Chaos(tmp_path)
    cells = chaos.nosplit if spec.real_cells else chaos.cheap
    results = _random_kills(chaos, rng, spec, cells)
    cells = _torn_line_then_rank_killed(chaos, results, cells)
    _hangs_in_c(chaos, results, cells)
    # ---- fault: a kill during an env install: tests/envs/test_chaos.py (envs.prepare killed mid-install, then again)
    figures = chaos.figures(time.monotonic() - start)
    with capsys.disabled():
        print(figures)
    assert len(chaos.faults) >= 5 and not chaos.lost and chaos.orphans == 0 and not chaos.temp_left, figures


# ---- hostile repros: one run, each hostile cell followed by a healthy probe ----------------------------

HOSTILE_RETURNS = {"ret_bool": "bool", "ret_list": "list", "ret_bad_keys": "dict"}
"""``run()`` answers that are not a dict of JSON values: that cell's error (REGRESSION), and the launch goes on."""
HOSTILE_STATE = ["patch_adamw", "warn_error", "sys_path", "anomaly", "matmul", "set_env", "chdir"]
"""Global monkeypatching, warning filters, sys.path, torch defaults, os.environ, cwd: left behind by the cell."""
WORKER_UNDOES = {"warn_error"}
"""State the worker itself restores after every cell: run() runs inside ``warnings.catch_warnings`` (it records
the cell's warnings), so a filter the cell set is gone before the next cell, and the probe after it proves it."""
LEAKED_ENV = {
    "ACCELERATE_USE_FSDP": "true",
    "FSDP_SHARDING_STRATEGY": "1",
    "ACCELERATE_MIXED_PRECISION": "no",
    # variables that change what a cell exercises (runner/protocol.py; review 2026-11-28 defect 4)
    "TORCH_COMPILE_DISABLE": "1",
    "TORCHDYNAMO_DISABLE": "1",
    "CUDA_LAUNCH_BLOCKING": "1",
    "TORCH_DISTRIBUTED_DEBUG": "DETAIL",
}
"""The caller's shell steering accelerate's FSDP choices: the ranks must start without them."""


def _hostile_matrix(folder: Path) -> Tuple[Path, List[str], List[str]]:
    """tests/runner/hostile_matrix.yaml with one probe cell per hostile one (ids ``fault_probe-nI``); the matrix,
    the hostile faults, and the cells in run order: probe, then each hostile cell followed by its own probe."""
    data = yaml.safe_load((HERE / "runner" / "hostile_matrix.yaml").read_text())
    case = data["cases"][0]
    case["repro"] = str(HERE / "runner" / "hostile_cells.py")
    hostile = [f for f in case["grids"][0]["fault"] if f != "probe"]
    case["grids"] = [{"fault": ["probe"], "n": list(range(len(hostile) + 1))}, {"fault": hostile}]
    data["combos"][0]["id"] = "chaos"
    path = folder / "hostile-matrix.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    order = ["hostile/fault_probe-n0-ws2"]
    for i, fault in enumerate(hostile, 1):
        order += [f"hostile/fault_{fault}-ws2", f"hostile/fault_probe-n{i}-ws2"]
    return path, hostile, order


@pytest.mark.heavy  # nox -s heavy: 12 hostile repros in one run (~60 s); test_chaos[tests] stays
@pytest.mark.timeout(1800)
def test_hostile_repros_in_one_run_leave_every_later_cell_truthful(tmp_path, capsys):
    """Non-dict returns, global monkeypatching (and the other state a cell can leave), leaked env variables, a
    megabyte output and message, chdir and a child that never exits, interleaved with healthy probes in one run
    (``python -m fsdp_matrix run``, as a user runs it, with the leaked variables in its environment). Every probe
    passes, each hostile cell gets its own true verdict, and nothing of the run is left behind."""
    start = time.monotonic()
    chaos = Chaos(tmp_path)
    matrix, hostile, order = _hostile_matrix(tmp_path)
    assert set(HOSTILE_RETURNS) | set(HOSTILE_STATE) | {"big_error", "child_forever"} == set(hostile)
    results = tmp_path / "hostile"
    proc = chaos.start(results, order, matrix=matrix, env=LEAKED_ENV)
    assert proc.wait(timeout=RUN_TIMEOUT_S) == 1, chaos.log()  # 1: the non-dict returns are REGRESSIONs
    chaos.faults.update({"hostile repro": len(hostile), "leaked env variable": len(LEAKED_ENV)})
    recs = {r.key: r for r in chaos.settle(results)}
    assert sorted(recs) == sorted(order), chaos.log()  # every cell got its record, once
    # torch's inductor writes TORCHINDUCTOR_CACHE_DIR into os.environ once an earlier test of this process compiled
    # (nox -s heavy runs its tests in one process): the run inherits it, and it is stripped and listed like the others
    already = {k for k in os.environ if stripped(k)}
    for key in order:
        rec = recs[key]
        assert sorted(rec.observed.env_removed) == sorted(already | set(LEAKED_ENV)), (key, rec.observed.env_removed)
    probes = [recs[k] for k in order if "fault_probe" in k]
    assert [r.verdict for r in probes] == ["fix-holds"] * len(probes), [r.line for r in probes]
    for fault, what in HOSTILE_RETURNS.items():
        rec = recs[f"hostile/fault_{fault}-ws2"]
        assert rec.verdict == "REGRESSION" and "run() returned" in rec.line and what in rec.line, rec.line
    for fault in HOSTILE_STATE:
        rec = recs[f"hostile/fault_{fault}-ws2"]
        assert rec.verdict == "fix-holds", rec.line
        if fault in WORKER_UNDOES:
            assert not rec.observed.note, (fault, rec.observed.note)  # undone by the worker: nothing to restart
            continue
        assert "global state changed by the cell" in rec.observed.note, (fault, rec.observed.note)
        assert "ranks restarted before the next cell" in rec.observed.note, (fault, rec.observed.note)
    big = recs["hostile/fault_big_error-ws2"]  # 2 MB on stdout, then an 8 MB message: reproduced, and clipped
    assert big.verdict == "reproduced", big.line
    message = big.observed.error_message
    assert message.startswith("huge message head") and message.endswith("huge message tail")
    assert len(message) <= records.MESSAGE_CHARS
    assert len(json.dumps(big.to_json())) < 256 << 10
    child = recs["hostile/fault_child_forever-ws2"]  # a child that ignores SIGTERM: killed, ranks restarted
    assert child.verdict == "fix-holds" and "child processes left running" in child.observed.note, child.observed
    figures = chaos.figures(time.monotonic() - start)
    with capsys.disabled():
        print(f"\n{figures}; {len(order)} cells in one run: {len(probes)} probes fix-holds")
    assert not chaos.lost and chaos.orphans == 0 and not chaos.temp_left, figures
