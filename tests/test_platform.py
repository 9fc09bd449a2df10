"""Moving the shared facts into ``platform:`` changed no expected outcome, except as listed and explained.

tests/fixtures/expectations_main.json holds the expected outcome of every cell (world size 1 and 2) on every combo's
pins, computed by tests/outcomes.py with main's matrix.yaml and code (commit a9cf680, before the move). This test
computes the same with the current matrix.yaml and code and allows only these differences:

- **order**: both skip, and the old reason's fact is a platform skip that still matches the cell; a cell two
  platform facts apply to (e.g. torch 2.4 with accelerate 0.33: no FSDP2 on CPU, and no FSDP2 in accelerate) now
  gets the first in the platform's fixed order, where each case used to order them its own way;
- **wording**: both skip for the same fact, whose copies were worded two ways (one text kept);
- **signature** (torch 2.6 FSDP2 on CPU): main skipped the cell; now it runs, since on 2.6 a case's own error can
  come first (observed for mixed-dtype), and the record_event AttributeError of torch 2.6 is judged skipped by the
  ``fsdp2-no-cpu`` signature: same final verdict on the old rule's own observed message;
- **signature** (PEFT 0.10): main expected PEFT 0.10's AttributeError (get_module_class_from_name) as an error,
  so the cell was "reproduced" though the case's bug was never reached; a platform signature now judges that
  error ``skipped``.
  Checked on the verdict: ``judge`` on the rule's own message gives reproduced with main's expectation and
  skipped with the new one.

Updated on purpose since (each entry of the fixture set to the new expectation, nothing else regenerated):

- 2026-11-28, the first GPU run (docs/pages/observed/gpu/2026-11-28): qdora-cpu-init's ``quantized_on: cuda``
  cells (no rule before) and mixed-dtype's Trainer bf16 cell at world size 1 under transformers < 4.47 got rules
  from what the device observed: 26 entries.

When a later change of matrix.yaml changes an expectation on purpose, review the difference this test prints, then
regenerate the fixture with ``PYTHONPATH=. python -m tests.outcomes > tests/fixtures/expectations_main.json``.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Dict, Optional, Tuple

from fsdp_matrix.cells import find_cell
from fsdp_matrix.expectations import Expected, trace
from fsdp_matrix.matrix import load_matrix
from fsdp_matrix.verdicts import Verdict, judge
from tests.outcomes import decode, device_of, outcomes

FIXTURE = Path(__file__).parent / "fixtures" / "expectations_main.json"

OLD_FACTS = {
    "FSDP2 has no CPU path": "fsdp2-no-cpu",
    "this accelerate has no FSDP2": "accelerate-no-fsdp2",
    "Trainer builds FSDP1": "trainer-builds-fsdp1",
    "no autocast_adapter_dtype": "no-autocast-option",
    "bitsandbytes has no CPU 4-bit": "bnb-no-cpu-4bit",
    "refuses bitsandbytes 4-bit": "transformers-no-cpu-4bit",
}
"""A phrase of each moved skip's old reason -> the platform skip that holds the fact now."""

PEFT010 = "type object 'FullyShardedDataParallelPlugin' has no attribute 'get_module_class_from_name'"
RECORD_EVENT = "'Stream' object has no attribute 'record_event'"
"""torch 2.6.0's FSDP2 error on CPU, as the old skip rules quote it."""


def _fact(reason: Optional[str]) -> Optional[str]:
    return next((fact for phrase, fact in OLD_FACTS.items() if phrase in (reason or "")), None)


def _classify(old: Dict, new: Dict, tr) -> Tuple[str, str]:
    """``(kind of difference, detail)``; kind ``unexplained`` fails the test."""
    if old["requires"] != new["requires"]:
        return "unexplained", f"requires {old['requires']!r} -> {new['requires']!r}"
    if old["kind"] == "skip" and _fact(old["reason"]) == "fsdp2-no-cpu" and tr.expected.kind != "skip":
        # torch 2.6: the cell runs now, and its record_event error is judged skipped by the signature
        after = judge(tr.expected, "error", "AttributeError", RECORD_EVENT, "torch.cuda.streams")
        if after.verdict is Verdict.SKIPPED and "fsdp2-no-cpu" in after.line:
            return "signature", "skip -> runs, record_event error judged skipped"
        return "unexplained", f"skip -> {after.verdict.value}"
    if old["kind"] == new["kind"] == "skip":
        # the new reason: another platform skip, or the case's own skip (its feature missing in that peft)
        fact, now = _fact(old["reason"]), tr.expected.platform or f"expect[{tr.expected.rule}]"
        # the old fact still applies: as a platform skip, or (fsdp2-no-cpu on torch 2.6) as a signature
        matched = {t.name.split("(")[-1].rstrip(")") for t in tr.trials if t.stage.startswith("platform") and t.matched}
        if fact and now and fact in matched:
            return ("wording" if fact == now else "order"), f"{fact} -> {now}"
        return "unexplained", f"skip {old['reason']!r} -> {new['reason']!r}"
    if old["kind"] == "error" and old["error_type"] == "AttributeError" and old["match"] == PEFT010:
        before = judge(
            Expected(**{k: old[k] for k in ("kind", "error_type", "match", "module")}),
            "error",
            "AttributeError",
            PEFT010,
            "peft.utils.other",
        )
        after = judge(tr.expected, "error", "AttributeError", PEFT010, "peft.utils.other")
        if before.verdict is Verdict.REPRODUCED and after.verdict is Verdict.SKIPPED:
            return "signature", "reproduced -> skipped"
        return "unexplained", f"{before.verdict.value} -> {after.verdict.value}"
    return "unexplained", f"{old} -> {new}"


def differences():
    matrix = load_matrix()
    main = decode(json.loads(FIXTURE.read_text()))
    now = outcomes(matrix)
    # combos added since (torch2.6-acc1.12, for one case) have their own observed rules; main's all stay
    assert set(main) <= set(now), "main's combos are missing"
    found = []
    for combo in (c for c in matrix.combos if c.id in main):
        old_cells, new_cells = main[combo.id], now[combo.id]
        # main's cells all stay (new cases only add cells, compared by their own observed rules)
        assert set(old_cells) <= set(new_cells), f"{combo.id}: main's cells are missing"
        for key, old in old_cells.items():
            new = new_cells[key]
            if old == new:
                continue
            cell = find_cell(matrix, key, device_of(combo), int(re.search(r"ws(\d+)$", key).group(1)))
            tr = trace(matrix.case(cell.case), cell, combo.pins.model_dump())
            found.append((combo.id, key, *_classify(old, new, tr)))
    return found, sum(len(c) for c in main.values())


def test_platform_move_changes_only_what_is_listed():
    found, total = differences()
    unexplained = [f for f in found if f[2] == "unexplained"]
    assert not unexplained, "\n".join(" ".join(map(str, f)) for f in unexplained[:20])
    kinds = Counter(f[2] for f in found)
    # every kind of difference the docstring lists was met, and most cells did not move at all
    assert set(kinds) <= {"order", "wording", "signature"}
    assert total - len(found) > len(found)


if __name__ == "__main__":
    found, total = differences()
    print(f"{total} (combo, cell) pairs; {total - len(found)} identical; differences: {Counter(f[2] for f in found)}")
    for f in found:
        print(*f)


def test_a_newcomers_case_without_platform_rules_gets_them_on_every_combo(tmp_path):
    """The README's example case, with no platform fact copied into it: every combo gives it the platform's skips
    and signatures, so it meets no DIFFERENT-ERROR on combos its author never ran."""
    import yaml

    from fsdp_matrix.cells import expand_case

    data = yaml.safe_load((Path(__file__).resolve().parent.parent / "matrix.yaml").read_text())
    data["cases"] = [c for c in data["cases"] if c["id"] != "my-bug"]  # the README's toy, added by test_readme's copy
    data["cases"].append(
        {
            "id": "my-bug",
            "title": "t",
            "report": "r",
            "repro": "repros/lora_requires_grad.py",
            "grids": [
                {
                    "adapter": ["lora"],
                    "dtype": ["fp32"],
                    "orig": [0, 1],
                    "wrap": ["decoder_layer", "peft_policy"],
                    "model": ["llama"],
                },
                {"adapter": ["lora"], "dtype": ["fp32"], "wrap": ["fsdp2"], "model": ["llama"]},
            ],
            "expect": [
                {
                    "when": {"orig": 0, "wrap": "decoder_layer"},
                    "error": {"type": "ValueError", "match": "uniform"},
                    "source": "s",
                },
                {"ok": True, "source": "s"},
            ],
        }
    )
    from fsdp_matrix.matrix import parse_matrix

    matrix = parse_matrix(data)
    case = matrix.case("my-bug")
    seen = Counter()
    for combo in matrix.combos:
        if combo.cases:
            continue  # a pairing combo runs only its own cases (torch2.6-acc1.12: accelerate-ignored-params)
        pins = combo.pins.model_dump()
        for cell in expand_case(case, device_of(combo)):
            tr = trace(case, cell, pins)
            wrap, torch = cell.params_dict["wrap"], tuple(int(x) for x in pins["torch"].split(".")[:2])
            on_cpu = cell.device == "cpu"
            if wrap == "fsdp2" and on_cpu and torch < (2, 6):
                assert tr.expected.platform == "fsdp2-no-cpu", (combo.id, cell.key)
                seen["skipped before running"] += 1
            elif wrap == "fsdp2" and on_cpu and torch < (2, 7):
                # torch 2.6: it runs, and the record_event error is judged skipped
                verdict = judge(tr.expected, "error", "AttributeError", RECORD_EVENT, "torch.cuda.streams").verdict
                assert verdict is Verdict.SKIPPED, (combo.id, cell.key)
                seen["record_event judged skipped"] += 1
            if combo.id == "mixed-peft0.10-acc1.15" and wrap == "peft_policy":
                verdict = judge(tr.expected, "error", "AttributeError", PEFT010, "peft.utils.other").verdict
                assert verdict is Verdict.SKIPPED, cell.key
                seen["PEFT 0.10 policy judged skipped"] += 1
    assert seen == {
        "skipped before running": 2,  # torch2.4, torch2.5 (the GPU combos run on cuda)
        "record_event judged skipped": 1,
        "PEFT 0.10 policy judged skipped": 2,
    }
