"""``tests/triage/formats.py``: the formats the corpus tool measures (``--formats``), each on three traceback fixtures
of tests/fixtures/triage/ (the records' and the threads' own, not the corpus): the claim a paste gets as pasted, it
keeps in each format (wrapped, rich, log prefixes, a web page's entities). The dev half's figures per format are in
docs/pages/triage-measured.md."""

from pathlib import Path

import pytest

from fsdp_matrix.matrix import load_matrix
from fsdp_matrix.triage.match import claims, match
from fsdp_matrix.triage.parse import parse
from tests.triage.formats import FORMATS, rich

ROOT = Path(__file__).resolve().parents[2]
MATRIX = load_matrix(ROOT / "matrix.yaml", check_repros=False)
PASTES = {
    "records_mixed_dtype.txt": "mixed-dtype",
    "accelerate2872_no_split.txt": "no-split-modules",
    "llamafactory3550_dora_rank0.txt": "dora-sharded-weight",
}


def _paste(name):
    return (
        "\n".join(
            line
            for line in (ROOT / "tests" / "fixtures" / "triage" / name).read_text().splitlines()
            if not line.startswith("# ")
        )
        + "\n"
    )


def _first(text):
    found = claims(match(MATRIX, parse(text)))
    return found[0].case.id if found else None


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_a_paste_keeps_its_claim_in_each_format(name):
    for paste, case in PASTES.items():
        text = _paste(paste)
        assert _first(text) == case
        assert _first(FORMATS[name](text)) == case, paste


def test_the_rich_format_draws_frames_in_a_box_and_the_exception_after_it():
    drawn = rich('Traceback (most recent call last):\n  File "/x/y.py", line 3, in f\n    g()\nValueError: boom\n')
    assert "│ /x/y.py:3 in f" in drawn and "❱ 3 │   g()" in drawn
    assert drawn.splitlines()[-1] == "ValueError: boom" and "╰" in drawn.splitlines()[-2]
