"""``python -m fsdp_matrix nightly PREVIOUS NEW [--summary PATH]``: the nightly's logic in one entry point.

1. diff the two reports (``report.diff``): which cells changed verdict, and which combos' versions moved;
1b. rerun every flipped cell before it counts (``confirm.py``): twice (``--reruns``) in a fresh launch in tonight's
   env, and as often at last night's commits where the sources moved. A flip that does not repeat is flaky: listed
   apart, no alert, and nothing below runs for it; when NEW is a results dir, each rerun cell's record is appended
   again with its ``confirmation``, so tonight's records say which flips were flaky;
2. for every combo whose versions moved (a floating ``newest`` picking up a release) and that has a cell whose
   verdict changed between two verdicts about the bug (not env-error, crash, hang or skipped), run the upgrade
   check from last night's versions to tonight's on the changed cells' cases: which package, and which release of
   it, changed each cell;
3. for every combo built from source (the ``main`` combo: its records' ``sources``) whose commits moved and that has
   such a changed cell (confirmed: it repeated tonight, and not at last night's commits), run the commit bisect
   (bisect/commits.py) of each moved package from last night's commit to tonight's on the changed cells, the
   other packages held as tonight: which commit, and which PR, changed them;
4. write all of it to the step summary (``$GITHUB_STEP_SUMMARY``) and stdout.

Exit 1 on an alert (as ``diff``: a new REGRESSION, or a passing cell that now needs attention, unless its reruns
called it flaky), 2 when a report cannot be read.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from packaging.version import InvalidVersion, Version

from fsdp_matrix.bisect.rerun import NightEnvs, moved, rerun_cells
from fsdp_matrix.bisect.runner import stopped_by_signal
from fsdp_matrix.bisect.wiring import StepOptions, add_step_arguments
from fsdp_matrix.confirm import CONFIRMED, RUNS, Confirmed, Flip, confirm, cost_note
from fsdp_matrix.errors import MatrixError
from fsdp_matrix.matrix import PACKAGES, Combo, Matrix, Pins, load_matrix
from fsdp_matrix.paths import writable_file
from fsdp_matrix.records import RECORDS_FILE, append, iter_records, latest
from fsdp_matrix.report.diff import ReportDiff, ReportInputError, compare, load_report, render, with_confirmation
from fsdp_matrix.report.grid import LOCAL
from fsdp_matrix.usage import OneLineParser, flat
from fsdp_matrix.verdicts import ABOUT_THE_BUG


def _public(version: Optional[str]) -> Optional[str]:
    try:
        return Version(version).public if version else None
    except InvalidVersion:
        return version


def _versions(report: Dict[str, Any]) -> Dict[str, Dict[str, Optional[str]]]:
    return {c["id"]: {p: _public((c.get("versions") or {}).get(p)) for p in PACKAGES} for c in report["columns"]}


def check_upgrade(base: Combo, bumps: Dict[str, str], cases: List[str], args: argparse.Namespace) -> Dict[str, Any]:
    """The real upgrade check (installs envs, runs cells); the nightly test replaces it with a fake."""
    from fsdp_matrix.bisect.upgrade import run_upgrade
    from fsdp_matrix.bisect.wiring import StepOptions, bisection_from
    from fsdp_matrix.cells import expand
    from fsdp_matrix.progress import Heartbeat

    matrix = load_matrix(args.matrix)
    cells = [c.key for c in expand(matrix, args.device, args.world_size, cases=cases)]
    with Heartbeat(f"upgrade {base.id}", "starting") as beat:
        wired = bisection_from(StepOptions.from_args(args), base, say=beat.say, status=beat.update)
        return run_upgrade(base, bumps, cells, wired.installer, wired.runner, beat=beat).to_json()


def _sources(report: Dict[str, Any]) -> Dict[str, Dict[str, Dict[str, Any]]]:
    return {c["id"]: dict(c.get("sources") or {}) for c in report["columns"]}


def check_commits(combo: Combo, package: str, good: Dict, bad: Dict, held: List[str], cells: List[str], args) -> Dict:
    """The real commit bisect of ``package`` from ``good``'s commit to ``bad``'s (``{url, commit}`` as records keep
    them) on ``cells``, the other packages pinned by ``held`` (``--pin`` texts); its JSON answer. The nightly test
    drives it over a toy repository."""
    from fsdp_matrix.bisect import commits
    from fsdp_matrix.bisect.wiring import StepOptions

    # as the command bisect --git runs it: each cell at its id's world size, 900 s a step
    step = dataclasses.replace(StepOptions.from_args(args), world_size=None, timeout=900)
    request = commits.CommitRequest(
        cells, package, bad["url"], good["commit"], bad["commit"], combo.id, held, None, step
    )
    try:
        code, answer = commits.run(request)
    except MatrixError as exc:
        print(f"fsdp-matrix bisect: {flat(exc)}", file=sys.stderr)
        code, answer = 2, None
    return (
        answer
        if answer is not None
        else {"error": f"the commit bisect exited {code} without an answer (see the log above)"}
    )


def commit_section(column: str, package: str, good: Dict, bad: Dict, result: Dict[str, Any], verdicts: Dict) -> str:
    moved = f"{package} {good['commit'][:10]} -> {bad['commit'][:10]}"
    out = [f"### Commit bisect for `{column}`: {moved} ({result.get('commits', '?')} commits)", ""]
    if result.get("error"):
        return "\n".join(out + [str(result["error"]), ""]) + "\n"
    out += ["| cell | last night | tonight | first changed commit | PR |", "| --- | --- | --- | --- | --- |"]
    for cell, answer in (result.get("cells") or {}).items():
        commit = answer.get("commit") or {}
        old, new = verdicts.get(cell, ("?", "?"))
        if commit:
            what = f"**{commit['sha'][:10]}** {commit['subject']}"
            pr = f"#{commit['pr']}" if commit.get("pr") else "-"
        else:
            what, pr = answer.get("answer") or "-", "-"
        out.append(f"| `{cell}` | {old} | {new} | {what} | {pr} |")
    out += ["", f"{result.get('installs', '?')} installs (bound {result.get('install_bound', '?')}), "
                f"{len(result.get('steps') or [])} steps, {result.get('minutes', '?')} min."]  # fmt: skip
    return "\n".join(out) + "\n"


def _commit_checks(column, matrix, before, after, versions, changes, args, summary, report) -> None:
    """The source side of the nightly: the packages whose commits moved, bisected over the changed cells, the others
    held as tonight (``versions``: tonight's column versions; ``before`` / ``after``: column -> its sources)."""
    verdicts = {c.cell: (c.old, c.new) for c in changes if c.column == column}
    moved = {
        p: (before[column][p], src)
        for p, src in after[column].items()
        if p in before[column] and src.get("commit") and before[column][p].get("commit") != src.get("commit")
    }
    if not verdicts or not moved:
        return
    known = {c.id: c for c in matrix.combos}
    if column not in known:
        summary.append(f"### Commit bisect for `{column}`\n\n{column} is not a combo of matrix.yaml: not bisected\n")
        return
    combo = known[column]
    for package, (good, bad) in moved.items():
        held = [f"{p}=={_public(str(versions[p]).split(' @ ')[0])}" for p in PACKAGES if p in versions and versions[p]]
        held = [h for h in held if h.split("==")[0] not in after[column]]
        held += [f"{p}={s['url']}@{s['commit']}" for p, s in after[column].items() if p != package]
        print(f"nightly: {column}: {package} moved {good['commit'][:10]} -> {bad['commit'][:10]} and "
              f"{len(verdicts)} cells changed: running the commit bisect", flush=True)  # fmt: skip
        result = check_commits(combo, package, good, bad, held, sorted(verdicts), args)
        summary.append(commit_section(column, package, good, bad, result, verdicts))
        report.append({"column": column, "package": package, "good": good, "bad": bad, "commit_bisect": result})


def _base_combo(matrix: Matrix, column: str, versions: Dict[str, Optional[str]]) -> Optional[Combo]:
    if any(versions.get(p) is None for p in PACKAGES):
        return None
    pins = {p: versions[p] for p in PACKAGES}
    known = {c.id: c for c in matrix.combos}
    if column in known:
        return known[column].with_pins(**pins)
    # a column matrix.yaml no longer has: its versions are all there is to go on
    return Combo(id=column, pins=Pins(**pins), tags=["nightly"], allow_cuda_build=True)


def upgrade_section(column: str, base: Combo, bumps: Dict[str, str], result: Dict[str, Any]) -> str:
    moved = ", ".join(f"{p} {base.pins.model_dump()[p]} -> {v}" for p, v in bumps.items())
    out = [f"### Upgrade check for `{column}`: {moved}", ""]
    changed = result.get("changed") or []
    if not changed:
        out.append("No cell changed verdict between last night's and tonight's versions when run side by side.")
    else:
        out += ["| cell | last night | tonight | first changed | last unchanged |", "| --- | --- | --- | --- | --- |"]
        for c in changed:
            first = ", ".join(f"{k} {v}" for k, v in (c.get("first_changed") or {}).items()) or "-"
            last = ", ".join(f"{k} {v}" for k, v in (c.get("last_unchanged") or {}).items()) or "-"
            out.append(f"| `{c['cell']}` | {c['base_verdict']} | {c['target_verdict']} | **{first}** | {last} |")
    out.append("")
    out.append(
        f"{result.get('installs', '?')} envs ({result.get('installed', '?')} installed), "
        f"bound {result.get('install_bound', '?')}."
    )
    return "\n".join(out) + "\n"


def _reruns(text: str) -> int:
    if not text.isdigit() or int(text) < 2:
        raise argparse.ArgumentTypeError(f"a flip is confirmed by at least 2 reruns, not {text!r}")
    return int(text)


def night_envs(matrix: Matrix, old: Dict[str, Any], new: Dict[str, Any], args: argparse.Namespace) -> NightEnvs:
    """What rebuilds each column's env for the reruns: its combo at tonight's versions, and both nights' sources."""
    combos = {}
    for column, versions in _versions(new).items():
        # a source build's version names its commit ("0.22.0.dev0 @ abc1234"); its pin is replaced by the build
        plain = {p: _public(str(v).split(" @ ")[0]) if v else v for p, v in versions.items()}
        try:
            combo = _base_combo(matrix, column, plain)
        except ValueError:  # pydantic's ValidationError: a version that is no exact pin; nothing rebuilds it
            combo = None
        if combo is not None:
            combos[column] = combo
    return NightEnvs(combos, _sources(new), _sources(old), StepOptions.from_args(args))


def confirm_flips(flips: List[Flip], envs: NightEnvs, args: argparse.Namespace) -> Confirmed:
    """The real reruns (installs envs, launches cells); the nightly tests replace it or its ``rerun_cells``."""
    columns = [c for c in {f.column for f in flips} if moved(envs, c)]
    if flips:
        print(f"nightly: {len(flips)} cells flipped: rerunning each {args.reruns} times before it counts", flush=True)
    return confirm(flips, lambda ask: rerun_cells(ask, envs), columns, args.reruns)


def _confirmed_diff(diff: ReportDiff, envs: NightEnvs, args: argparse.Namespace) -> Tuple[ReportDiff, Confirmed]:
    """``diff`` with every flip rerun and marked; tonight's records (when NEW is a results dir) say so too."""
    flips = [
        Flip(c.column, c.cell, c.old, c.new)
        for c in diff.regressions + diff.broken + diff.unexpected_fixes + diff.changed
    ]
    confirmed = confirm_flips(flips, envs, args)
    if Path(args.new).is_dir() or str(args.new).endswith(".jsonl"):
        _mark_records(Path(args.new), confirmed)
    return with_confirmation(diff, {k: c.status for k, c in confirmed.flips.items()}), confirmed


def _mark_records(results: Path, confirmed: Confirmed) -> None:
    """Append, next to each rerun cell's newest record, a copy of it holding its confirmation (the newest wins)."""
    files = [results] if results.is_file() else sorted(results.rglob(RECORDS_FILE))
    for file in files:
        for (combo, key), rec in latest(iter_records(file)).items():
            found = confirmed.flips.get((combo or LOCAL, key))
            if found is not None:
                append(file.parent, dataclasses.replace(rec, confirmation=found))


def nightly(args: argparse.Namespace) -> int:
    try:
        old, new = load_report(args.previous), load_report(args.new)
        for path, what in ((args.json, "--json"), (args.summary, "--summary")):
            if path:
                writable_file(path, what)
    except (ReportInputError, MatrixError) as exc:
        print(f"nightly: {flat(exc)}", file=sys.stderr)
        return 2
    matrix = load_matrix(args.matrix)
    envs = night_envs(matrix, old, new, args)
    diff, confirmed = _confirmed_diff(compare(old, new), envs, args)
    text = render(diff, "last night", "tonight")
    summary = ["## Changes since the previous night", "", "```", text.rstrip(), "```", "", cost_note(confirmed), ""]
    print(text, flush=True)
    before, after = _versions(old), _versions(new)
    # env-error, crash, hang and skipped say nothing about the bug: bisecting them would reinstall and fail again;
    # and only a confirmed flip is bisected (a flaky one is a ghost)
    changes = [
        c
        for c in diff.regressions + diff.broken + diff.unexpected_fixes + diff.changed
        if c.new in ABOUT_THE_BUG and (c.old is None or c.old in ABOUT_THE_BUG) and c.confirmation == CONFIRMED
    ]
    report: List[Dict[str, Any]] = []
    src_before, src_after = envs.last_night, envs.tonight
    raw = {c["id"]: c.get("versions") or {} for c in new["columns"]}
    for column in sorted(set(before) & set(after)):
        if src_after.get(column):
            # built from source: its versions say 0.22.0.dev0 whatever the commit, so its commits are what moved
            _commit_checks(column, matrix, src_before, src_after, raw[column], changes, args, summary, report)
            continue
        bumps = {p: v for p, v in after[column].items() if v and before[column].get(p) not in (None, v)}
        cases = sorted({c.cell.split("/", 1)[0] for c in changes if c.column == column})
        if not bumps or not cases:
            continue
        base = _base_combo(matrix, column, before[column])
        if base is None:
            continue
        print(f"nightly: {column} moved ({', '.join(f'{p} -> {v}' for p, v in bumps.items())}) and changed "
              f"{len(cases)} cases: running the upgrade check", flush=True)  # fmt: skip
        try:
            result = check_upgrade(base, bumps, cases, args)
        except MatrixError as exc:
            result = {"changed": [], "error": str(exc)}
            summary.append(f"### Upgrade check for `{column}` failed\n\n{exc}\n")
        else:
            summary.append(upgrade_section(column, base, bumps, result))
        report.append({"column": column, "bumps": bumps, "cases": cases, "result": result})
    out = "\n".join(summary)
    print(out, flush=True)
    if args.summary:
        with open(args.summary, "a", encoding="utf-8") as fh:
            fh.write(out + "\n")
    if args.json:
        flips = [{"column": c, "cell": k, **dataclasses.asdict(v)} for (c, k), v in confirmed.flips.items()]
        args.json.write_text(json.dumps({"diff": text, "confirmed": flips, "upgrades": report}, indent=1, default=str))
    return 1 if diff.alerts else 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = OneLineParser(prog="python -m fsdp_matrix nightly", description=__doc__.split("\n\n")[0])
    p.add_argument("previous", type=Path, help="last night's report.json (or results dir)")
    p.add_argument("new", type=Path, help="tonight's")
    p.add_argument("--summary", type=Path, help="append the Markdown summary here (e.g. $GITHUB_STEP_SUMMARY)")
    p.add_argument("--json", type=Path, help="write the diff and upgrade answers as JSON")
    p.add_argument(
        "--reruns", type=_reruns, default=RUNS, help=f"reruns of each flipped cell before it counts (default {RUNS})"
    )
    # the step options, declared once (bisect/wiring.py)
    add_step_arguments(p, timeout=3600, world_size=2)
    args = p.parse_args(argv)
    return stopped_by_signal("nightly", lambda: _nightly(args))


def _nightly(args: argparse.Namespace) -> int:
    try:
        return nightly(args)
    except MatrixError as exc:
        print(f"nightly: {flat(exc)}", file=sys.stderr)
        return 2
