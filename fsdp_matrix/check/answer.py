"""The check answer as data: what ``check`` prints as text, and as JSON with ``--json`` (the same object).

Built on triage's answer models (``fsdp_matrix.triage.answer``): a workaround is triage's ``Workaround``, computed by
triage's ``versions.workarounds``, and the rule's "fixed in" by its ``versions.fixed_in``. ``schema_version``
changes when a field does (2: a workaround's ``together``, the settings its change needs beside it).
"""

from __future__ import annotations

from typing import Dict, List, Literal, Optional

from pydantic import Field

from fsdp_matrix.triage.answer import Workaround, _Model

EXIT_NONE, EXIT_FAILURE, EXIT_BAD_INPUT, EXIT_OUT_OF_SCOPE = 0, 1, 2, 3
"""Exit statuses: no known failure applies; one does; bad input (one line); out of the matrix's scope."""


class FileRead(_Model):
    """One file as its library read it."""

    kind: Literal["accelerate", "training_args", "peft", "bnb"] = Field(description="Which option gave it.")
    path: str = Field(description="The file.")
    loader: str = Field(description="The library call that read it, with the library's version.")
    cls: str = Field(description="The config class that took it (ClusterConfig, SFTConfig, LoraConfig...).")
    notes: List[str] = Field(description="What the library warned or dropped while reading, in its words.")


class Expectation(_Model):
    """One rule of a matched case, deciding some of the cells the setup matches."""

    rule: str = Field(description="Rule id: case/rule-id.")
    index: int = Field(description="Its index in the case's expect list (-1: a platform skip).")
    when: str = Field(description="The cells it is for: 'orig=0, wrap=decoder_layer' or 'every cell'.")
    outcome: str = Field(description="What it expects: 'ValueError: /.../ in torch.distributed.fsdp', 'ok'.")
    kind: str = Field(description="ok, error, hang, warning, skip.")
    conditions: List[str] = Field(description="Settings no file gave that the rule needs: 'dtype in [bf16]'.")
    cells: int = Field(description="How many of the matching cells it decides.")
    examples: List[str] = Field(description="Up to three of their ids (python -m fsdp_matrix explain CASE/CELL).")
    reproduces: str = Field(description="The rule's versions: 'peft <0.14' or 'any version'.")
    source: str = Field(description="Where the rule comes from (upstream link, observation).")
    evidence: Literal["observed", "nearest-combo", "rules"] = Field(
        description="observed on a combo with the user's versions, the nearest combo's records, or the rule's bounds."
    )
    evidence_line: str = Field(description="The records behind it, or why there are none.")
    fixed: Optional[str] = Field(description="Where it stops (a failing rule): its bound or the first combo.")
    fixed_versions: Dict[str, str] = Field(description="Package -> first version named as fixed.")
    workarounds: List[Workaround] = Field(description="One-setting changes of the case's cells that train.")
    workarounds_note: Optional[str] = Field(description="Why none is offered, when none is.")


class CaseAnswer(_Model):
    """A case whose cells the setup matches."""

    case: str = Field(description="Case id.")
    title: str = Field(description="Case title.")
    report: str = Field(description="Upstream report link(s).")
    status: Literal["applies", "may-apply", "trains", "not-run"] = Field(
        description="applies: a failing rule from the settings alone; may-apply: only if the script does what "
        "'needs' says or has a setting no file gave; trains: every matching cell is expected to train; not-run: the "
        "matrix skips them on these versions."
    )
    needs: str = Field(description="What the script must do for the case to apply ('' when the settings reach it).")
    entry: str = Field(description="The entry it was matched at (trl, trainer, accelerate, own).")
    matching_cells: int = Field(description="Cells of the case the setup matches.")
    expectations: List[Expectation] = Field(description="The rules deciding those cells, failing ones first.")


class CheckAnswer(_Model):
    """Everything ``check`` says about one setup."""

    schema_version: Literal[2] = 2
    versions: Dict[str, str] = Field(description="The versions answered for.")
    versions_from: str = Field(description="'given with --versions (the rest installed here)' or 'installed here'.")
    read: str = Field(description="Where the files were read (the installed libraries, or a combo's env).")
    files: List[FileRead] = Field(description="Each file read.")
    out_of_scope: Optional[str] = Field(description="Why no case can answer (DeepSpeed, no FSDP); null otherwise.")
    axes: Dict[str, List[str]] = Field(description="Axis -> the setup's values (empty: a value no case covers).")
    axes_from: Dict[str, str] = Field(description="Axis -> the settings it was taken from.")
    unknown_axes: List[str] = Field(description="Axes of the matched cases that no file gives.")
    entry: str = Field(description="trl, trainer, accelerate or own.")
    layout: str = Field(description="'8 processes on 1 machine, cuda'.")
    notes: List[str] = Field(description="What the mapping noticed (a setting the release did not read as written).")
    not_covered: List[str] = Field(description="FSDP / PEFT / quantization settings that map to no axis.")
    other_settings: List[str] = Field(description="Other settings no case varies (optimizer, logging...).")
    plumbing: List[str] = Field(description="Process-start settings (addresses, ranks).")
    outside_observed: List[str] = Field(description="Versions older or newer than every combo observed.")
    nearest_combo: Optional[str] = Field(description="The CPU combo nearest to the versions.")
    cases: List[CaseAnswer] = Field(description="Matched cases: applies first, then may-apply, not-run, trains.")
    records: Optional[str] = Field(description="What records were read (--results / --history).")

    @property
    def exit_status(self) -> int:
        if self.out_of_scope:
            return EXIT_OUT_OF_SCOPE
        return EXIT_FAILURE if any(c.status == "applies" for c in self.cases) else EXIT_NONE
