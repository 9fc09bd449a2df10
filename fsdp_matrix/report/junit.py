"""JUnit XML of the report, one file per combo, for CI test-result viewers.

A testcase per recorded cell (classname ``fsdp_matrix.<case>``, name the cell id); a failure, carrying the verdict
line and every rank's traceback or stack dump, for each verdict that needs attention; skipped for skipped cells.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from typing import Any

from fsdp_matrix.report.failure import failure_text
from fsdp_matrix.report.grid import LOCAL, Column, Grid
from fsdp_matrix.report.style import needs_attention
from fsdp_matrix.report.text import one_line
from fsdp_matrix.verdicts import Verdict

# XML 1.0 cannot hold most control characters, and ElementTree writes them anyway (ANSI colors in a message would
# make the whole file unparseable), so they are replaced before they reach the tree
_XML_BAD = re.compile("[^\t\n\r\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def xml_text(text: Any) -> str:
    return _XML_BAD.sub("\ufffd", "" if text is None else str(text))


def junit_xml(grid: Grid, column: Column) -> bytes:
    """One testsuite for one combo: a testcase per recorded cell, failure when it needs attention."""
    recs = [(row, rec) for row in grid.rows if (rec := grid.entry(column, row)) is not None]
    fails = sum(needs_attention(rec.verdict) for _, rec in recs)
    skips = sum(rec.verdict == Verdict.SKIPPED.value for _, rec in recs)
    suites = ET.Element("testsuites")
    suite = ET.SubElement(
        suites,
        "testsuite",
        name=xml_text(f"fsdp-matrix {column.id}"),
        tests=str(len(recs)),
        failures=str(fails),
        errors="0",
        skipped=str(skips),
        time=f"{sum(rec.duration_s or 0 for _, rec in recs):.3f}",
    )
    props = ET.SubElement(suite, "properties")
    for name, version in [("combo", column.id), ("label", column.label)] + sorted(column.versions.items()):
        ET.SubElement(props, "property", name=xml_text(name), value=xml_text(version or "-"))
    for row, rec in recs:
        case = ET.SubElement(
            suite,
            "testcase",
            classname=xml_text(f"fsdp_matrix.{row.case}"),
            name=xml_text(row.cell),
            time=f"{rec.duration_s or 0:.3f}",
        )
        if needs_attention(rec.verdict):
            fail = ET.SubElement(case, "failure", message=xml_text(one_line(rec.line)), type=xml_text(rec.verdict))
            fail.text = xml_text(failure_text(rec))
        elif rec.verdict == Verdict.SKIPPED.value:
            ET.SubElement(case, "skipped", message=xml_text(one_line(rec.line)))
    return ET.tostring(suites, encoding="utf-8", xml_declaration=True)


_COMBO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def junit_name(column: Column) -> str:
    """``junit-<combo>.xml``. A matrix.yaml combo id is a safe file name that starts with a letter or digit, so the
    other columns (records without a combo, ids from elsewhere) get names starting with ``_``: they never clash."""
    if column.id == LOCAL:
        return "junit-_local.xml"
    if _COMBO_ID.match(column.id):
        return f"junit-{column.id}.xml"
    return f"junit-_{column.number}-" + re.sub(r"[^A-Za-z0-9_.-]", "", column.id) + ".xml"
