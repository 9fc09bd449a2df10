"""matrix.yaml reads like a table: short lines, every rule named, each shared error signature written once, a case
on a screen."""

from __future__ import annotations

import statistics
from collections import Counter

import yaml

from fsdp_matrix.matrix import DEFAULT_MATRIX

LIMIT = 120
REQUIRES_GRAD = "uniform `?requires_grad`?"
"""A piece of the regex of torch's flatten requires_grad error (both wordings), the most shared signature."""


def _data():
    return yaml.safe_load(DEFAULT_MATRIX.read_text())


def test_no_line_over_120_characters():
    long = [
        f"{n}: {len(line)}" for n, line in enumerate(DEFAULT_MATRIX.read_text().splitlines(), 1) if len(line) > LIMIT
    ]
    assert not long, f"matrix.yaml lines over {LIMIT} characters (line: length): {', '.join(long)}"


def test_every_rule_has_an_id_and_a_written_id_is_kept():
    # a rule written without an id (the README's example) gets a derived one (matrix.derived_rule_id)
    from fsdp_matrix.matrix import load_matrix

    loaded = {c.id: c for c in load_matrix(DEFAULT_MATRIX).cases}
    for case in _data()["cases"]:
        ids = [rule.id for rule in loaded[case["id"]].expect]
        assert all(ids), case["id"]
        assert [r["id"] for r in case["expect"] if "id" in r] == [i for i, r in zip(ids, case["expect"]) if "id" in r]


def test_a_signature_several_rules_expect_is_named_once():
    data = _data()
    inline = Counter(
        (r["error"]["type"], r["error"]["match"], r["error"].get("module"))
        for case in data["cases"]
        for r in case["expect"]
        if isinstance(r.get("error"), dict)
    )
    inline.update(
        (e["type"], e["match"], e.get("module"))
        for sig in data["platform"]["signatures"]
        for e in sig["errors"]
        if isinstance(e, dict)
    )
    assert [sig for sig, n in inline.items() if n > 1] == []
    assert DEFAULT_MATRIX.read_text().count(REQUIRES_GRAD) == 1
    named = Counter(r["error"] for case in data["cases"] for r in case["expect"] if isinstance(r.get("error"), str))
    named.update(e for sig in data["platform"]["signatures"] for e in sig["errors"] if isinstance(e, str))
    unused = [name for name in data["errors"] if named[name] == 0]
    assert not unused, f"errors: entries no rule names: {unused}"


def _case_lines(text: str) -> dict:
    lines = text.splitlines()
    start = lines.index("cases:")
    heads = [i for i in range(start, len(lines)) if lines[i].startswith("  - id: ")]
    return {
        lines[a][len("  - id: ") :]: sum(1 for line in lines[a:b] if line.strip())
        for a, b in zip(heads, heads[1:] + [len(lines)])
    }


def test_the_median_case_is_at_most_30_lines():
    counts = _case_lines(DEFAULT_MATRIX.read_text())
    assert len(counts) == len(_data()["cases"])
    assert statistics.median(counts.values()) <= 30, sorted(counts.items(), key=lambda kv: kv[1])
