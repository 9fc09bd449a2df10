"""The triage answer as data: what ``triage`` prints as text, and as JSON with ``--json`` (the same object).

The models are the JSON schema (``Answer.model_json_schema()``); ``schema_version`` changes when a field does.
"""

from __future__ import annotations

from typing import Dict, List, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RuleFit(_Model):
    """One rule of a claimed case that fits the paste."""

    rule: str = Field(description="Which rule: expect[3].")
    when: str = Field(description="The cells it is for: 'orig=0, wrap=decoder_layer' or 'every cell'.")
    signature: str = Field(description="Exception type, regex, and raising module of the rule.")
    source: str = Field(description="Where the rule comes from (upstream link or observation).")
    level: Optional[Literal["strong", "likely", "weak"]] = Field(description="Evidence level of this fit.")
    evidence: List[str] = Field(description="What the paste shows for it: message fit, class, frames, FSDP, PEFT.")
    notes: List[str] = Field(description="What is missing or different (another class, no frame in its module).")
    reproduces: str = Field(description="The rule's versions: 'peft <0.14' or 'any version'.")
    in_range: Optional[bool] = Field(description="The user's versions are in the rule's range; null when unknown.")
    fixed: str = Field(description="Where it stops: the rule's own upper bound, or the first combo that trains.")
    fixed_versions: Dict[str, str] = Field(description="Package -> first version named as fixed; empty if none.")
    observed: List[str] = Field(description="What the records say of this rule (with --results).")


class Workaround(_Model):
    """A change of one of the matched rule's settings that trains on the versions shown."""

    change: str = Field(description="The setting changed: 'storage=bf16'.")
    rule: str = Field(description="The ok rule that says it trains: expect[7].")
    when: str = Field(description="That rule's cells.")
    cells: int = Field(description="How many cells of the case have this change and train.")
    examples: List[str] = Field(description="Up to three of their cell ids.")
    source: str = Field(description="The ok rule's source.")
    together: List[str] = Field(
        default_factory=list,
        description="Other settings its cells share without which the change alone still fails: 'autocast=0' "
        "(schema 3); empty when the change alone trains wherever it reaches.",
    )
    observed: Optional[str] = Field(description="fix-holds count in the records, where they ran.")


class Claim(_Model):
    """A case the paste is claimed to be, with its evidence and what is known on the user's versions."""

    case: str = Field(description="Case id.")
    title: str = Field(description="Case title.")
    report: str = Field(description="Upstream report link(s).")
    level: Literal["strong", "likely", "weak"] = Field(description="Evidence level of the claim.")
    fits: List[RuleFit] = Field(description="Its rules that fit, best first (at most three).")
    observed: List[str] = Field(description="Records with this error that no rule expected (verdict lines).")
    reproducing_cells: int = Field(description="Its CPU cells expected to raise this error on the user's versions.")
    example_cell: Optional[str] = Field(description="One of those cells, for `python -m fsdp_matrix export`.")
    workarounds_on: str = Field(description="'your versions', 'the nearest combo X', or '' when none are offered.")
    workarounds: List[Workaround] = Field(description="Changes of the matched rule's settings that train.")
    workarounds_note: Optional[str] = Field(description="Why no workaround is offered, when none is.")
    what_works: List[str] = Field(
        default_factory=list,
        description="What trains on the user's versions: settings to change, then releases newer than theirs that "
        "fix the matched rule (schema 2).",
    )


class Similar(_Model):
    """A case whose message the paste has, not claimed: the evidence points elsewhere or is too thin."""

    case: str = Field(description="Case id.")
    rule: Optional[str] = Field(description="The rule whose message it has, if a rule's.")
    reason: str = Field(description="'similar message, but this looks like DeepSpeed ZeRO-3, not FSDP', ...")


class PlatformFit(_Model):
    """A platform rule (a fact about a release) whose signature the paste fits."""

    rule: str = Field(description="platform[i].")
    versions: str = Field(description="The releases it holds for.")
    reason: str = Field(description="What it says.")
    source: str = Field(description="Where it comes from.")


class Answer(_Model):
    """Everything ``triage`` says about one paste."""

    schema_version: Literal[3] = 3
    errors: List[str] = Field(description="Exception lines read from the paste ('Type: message'), at most three.")
    raised_in: Optional[str] = Field(description="Innermost pasted frame in a known package (dotted module).")
    versions: Dict[str, str] = Field(description="The user's versions used (given or installed).")
    versions_from: str = Field(
        description="'given with --versions', 'stated in the paste' (schema 2) or 'installed here'."
    )
    outside_observed: List[str] = Field(description="Versions older or newer than every combo observed.")
    nearest_combo: Optional[str] = Field(description="The CPU combo nearest to the user's versions.")
    claims: List[Claim] = Field(description="Claimed cases, best first, shown in full (at most three).")
    also: List[str] = Field(description="Further claimed cases, one line each.")
    similar: List[Similar] = Field(description="Cases with a similar message that are not claimed.")
    platform: List[PlatformFit] = Field(description="Platform rules the paste fits.")
    records: Optional[str] = Field(description="How many records were read (with --results).")

    @property
    def matched(self) -> bool:
        """A claim or a platform fit: the exit status is 0, else 1."""
        return bool(self.claims or self.also or self.platform)
