"""Verdicts: what an expected outcome and an observed outcome together say about a cell."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Sequence

from fsdp_matrix.cells import Cell
from fsdp_matrix.clip import first_line
from fsdp_matrix.expectations import Expected, platform_signature, signature_matches, stack_fits, warning_raised
from fsdp_matrix.records import Observed, Record, clipped


class Verdict(str, enum.Enum):
    REPRODUCED = "reproduced"
    """The expected error was observed: the reported bug is still there."""
    FIX_HOLDS = "fix-holds"
    """ok was expected and observed, and every post-training check passed."""
    REGRESSION = "REGRESSION"
    """ok was expected, an error (or a failed check) was observed."""
    UNEXPECTED_FIX = "UNEXPECTED-FIX"
    """An error was expected and the cell trained fine: upstream changed, update matrix.yaml."""
    DIFFERENT_ERROR = "DIFFERENT-ERROR"
    """An error was expected and another one was observed (or no rule matched)."""
    HANG = "hang"
    """A rank did not finish within the per-cell timeout; stacks are in the record."""
    CRASH = "crash"
    """A rank died (signal or exit code) without reporting."""
    SKIPPED = "skipped"
    """Not run here: the machine lacks what it needs, or a rule says the env cannot do it."""
    ENV_ERROR = "env-error"
    """The env could not be built, imported or verified against its pins."""

    @property
    def passed(self) -> bool:
        """pytest passes a cell exactly when the observed outcome matches the expected one."""
        return self in (Verdict.REPRODUCED, Verdict.FIX_HOLDS)

    @property
    def needs_attention(self) -> bool:
        return self not in (Verdict.REPRODUCED, Verdict.FIX_HOLDS, Verdict.SKIPPED)


ABOUT_THE_BUG = frozenset(
    v.value
    for v in (
        Verdict.REPRODUCED,
        Verdict.FIX_HOLDS,
        Verdict.REGRESSION,
        Verdict.UNEXPECTED_FIX,
        Verdict.DIFFERENT_ERROR,
    )
)
"""Verdicts that say something about the bug: the cell ran to an outcome that matrix.yaml judged (not a skip, nor a
hang, crash or env-error, which say nothing about it)."""


STATUSES = ("ok", "error", "hang", "crash", "skipped", "env-error")
"""Observed statuses a record can carry."""


@dataclass(frozen=True)
class Judgement:
    """A verdict and the one-line reason for it."""

    verdict: Verdict
    """The verdict."""
    line: str
    """``expected ... / observed ...``, the line a failing test prints."""


def judge(
    expected: Expected,
    status: str,
    error_type: Optional[str] = None,
    message: Optional[str] = None,
    location: Optional[str] = None,
    *,
    stacks: Sequence[Optional[str]] = (),
    warnings: Sequence[Mapping[str, Any]] = (),
) -> Judgement:
    """The verdict for one cell: what matrix.yaml expected against what the ranks observed.

    hang, crash, env-error and skipped are verdicts of their own whatever was expected: none of them says anything
    about the bug, except a hang that a ``hang`` rule expects: reproduced when some rank's ``stacks`` fits the rule
    (else DIFFERENT-ERROR: it hung elsewhere). Otherwise ok meets ok (fix-holds, or REGRESSION when it raised the
    rule's ``no_warning``), a ``warning`` rule (reproduced when some rank raised it: ``warnings`` are every rank's,
    see RankResult.warnings; else UNEXPECTED-FIX) or an error or hang rule (UNEXPECTED-FIX); an error meets ok
    (REGRESSION), or is matched against the expected signature (reproduced, else DIFFERENT-ERROR). A cell no rule
    covers never passes.

    An error that would be REGRESSION or DIFFERENT-ERROR but fits one of the platform signatures the Expected carries
    is skipped instead: the env cannot run the cell (e.g. FSDP2 on a torch without a CPU path). The line keeps the
    observed error and names the signature, and the record keeps the observed error as it was.
    """
    if status not in STATUSES:
        raise ValueError(f"unknown observed status {status!r}")
    observed = _observed_line(expected, status, error_type, message, location, warnings)
    line = f"expected {expected.describe()} / observed {observed}"
    if status == "hang" and expected.kind == "hang":
        if stack_fits(expected, stacks):
            return Judgement(Verdict.REPRODUCED, line)
        elsewhere = f" (no rank's stack matches /{expected.match}/: hung elsewhere)"
        return Judgement(Verdict.DIFFERENT_ERROR, line + elsewhere)
    if status in ("hang", "crash", "env-error", "skipped"):
        return Judgement(Verdict(status), line)
    if expected.kind == "skip":
        # a skip rule means the cell should not have been run at all; running it anyway is a harness bug
        return Judgement(Verdict.DIFFERENT_ERROR, line + " (a skip rule matched, yet the cell ran)")
    if status == "ok":
        return _judge_ok(expected, line, warnings)
    return _judge_error(expected, line, error_type, message, location, warnings)


def _observed_line(
    expected: Expected,
    status: str,
    error_type: Optional[str],
    message: Optional[str],
    location: Optional[str],
    warnings: Sequence[Mapping[str, Any]],
) -> str:
    """The observed half of the line: the outcome, and for a rule about a warning whether some rank raised it."""
    observed = _describe(status, error_type, message, location)
    if status == "error" and expected.kind == "error" and expected.warning:
        sig, seen = expected.warning, warning_raised(expected.warning, warnings)
        if seen:
            return observed + f", after {seen['category']}: {first_line(seen['message'], 200)}"
        return observed + f", without {sig['type']}: /{sig['match']}/ before it"
    if status == "ok" and (expected.warning or expected.no_warning):
        sig = expected.warning or expected.no_warning
        seen = warning_raised(sig, warnings)
        observed += (
            f", with {seen['category']}: {first_line(seen['message'], 200)}"
            if seen
            else (f", without {sig['type']}: /{sig['match']}/")
        )
    return observed


def _judge_ok(expected: Expected, line: str, warnings: Sequence[Mapping[str, Any]]) -> Judgement:
    """The cell trained fine: met against an ok, warning, error or hang rule."""
    if expected.kind == "ok":
        raised = expected.no_warning and warning_raised(expected.no_warning, warnings)
        return Judgement(Verdict.REGRESSION if raised else Verdict.FIX_HOLDS, line)
    if expected.kind == "warning":
        seen = warning_raised(expected.warning, warnings)
        return Judgement(Verdict.REPRODUCED if seen else Verdict.UNEXPECTED_FIX, line)
    if expected.kind in ("error", "hang"):
        return Judgement(Verdict.UNEXPECTED_FIX, line)
    return Judgement(Verdict.DIFFERENT_ERROR, line + " (no rule in matrix.yaml matches this cell)")


def _judge_error(
    expected: Expected,
    line: str,
    error_type: Optional[str],
    message: Optional[str],
    location: Optional[str],
    warnings: Sequence[Mapping[str, Any]] = (),
) -> Judgement:
    """A rank raised: the expected signature (with the warning it says comes first, when it says one), else a
    platform signature (skipped), else REGRESSION or DIFFERENT-ERROR."""
    if signature_matches(expected, error_type, message, location):
        if expected.warning and not warning_raised(expected.warning, warnings):
            # the same message without the warning that says why (no input needs grad) is another way to it
            return Judgement(Verdict.DIFFERENT_ERROR, line + " (the rule's warning was not raised before it)")
        return Judgement(Verdict.REPRODUCED, line)
    platform = platform_signature(expected, error_type, message, location)
    if platform is not None:
        return Judgement(Verdict.SKIPPED, line + f" (platform signature {platform['id']}: {platform['reason']})")
    if expected.kind == "ok":
        return Judgement(Verdict.REGRESSION, line)
    if expected.kind == "none":
        line += " (no rule in matrix.yaml matches this cell)"
    return Judgement(Verdict.DIFFERENT_ERROR, line)


def changed_note(sources: Mapping[str, Mapping], versions: Optional[Mapping[str, Optional[str]]] = None) -> str:
    """What a verdict that differs from the rules means for a source build: the change is not in a release yet;
    unless every source is its release's own commit (a clean tree that installs as that very version, e.g. a pin
    at the tag v0.14.0), where the release itself differs from the rules."""
    versions = versions or {}

    def at_release(name: str, src: Mapping) -> bool:
        have = str(versions.get(name) or "").split("+")[0]
        return bool(src.get("release")) and not src.get("dirty") and have == src.get("release")

    built = ", ".join(
        f"{name} {src.get('commit', '')[:7]} "
        + ("(its release's own commit)" if at_release(name, src) else f"judged as {src.get('release') or 'no release'}")
        for name, src in sorted(sources.items())
    )
    if all(at_release(name, src) for name, src in sources.items()):
        return f"differs from the rules at a released version ({built})"
    return f"changed on main, not released yet ({built})"


def make_record(
    cell: Cell,
    expected: Expected,
    observed: Observed,
    versions: Mapping[str, Optional[str]],
    duration_s: float,
    combo: Optional[str],
    run_id: Optional[str],
    sources: Mapping[str, Dict],
) -> Record:
    """The record of one cell: what was expected, what was observed, and the verdict ``judge`` gives the pair.

    ``versions`` is what the env really holds (never the pins alone), so a record read later says what ran.
    ``sources`` are the env's source builds (fsdp_matrix.envs.sources.env_sources), empty for releases only.
    """
    judgement = judge(
        expected,
        observed.status,
        observed.error_type,
        observed.error_message,
        observed.location,
        stacks=[r.stack for r in observed.ranks],
        warnings=[w for r in observed.ranks for w in r.warnings],
    )
    line = judgement.line
    if sources and not judgement.verdict.passed and observed.status in ("ok", "error"):
        # rules are for releases; a source build is judged as its release base
        line += f" [{changed_note(sources, versions)}]"
    return Record(
        case=cell.case,
        cell=cell.id,
        params=cell.params_dict,
        versions=dict(versions),
        device=cell.device,
        world_size=cell.world_size,
        nodes=cell.nodes,
        expected=expected.to_json(),
        observed=clipped(observed),  # judged on the whole text above; stored as its head and tail
        verdict=judgement.verdict.value,
        duration_s=round(duration_s, 3),
        line=line,
        combo=combo,
        run_id=run_id,
        sources=dict(sources),
    )


def _describe(status: str, error_type: Optional[str], message: Optional[str], location: Optional[str]) -> str:
    if status != "error":
        return status if not message else f"{status} ({first_line(message, 200)})"
    where = f" in {location}" if location else ""
    return f"{error_type}: {first_line(message, 200)}{where}"
