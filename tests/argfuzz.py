"""Shared pieces of the Hypothesis tests over the commands' arguments: run ``python -m fsdp_matrix CMD ...`` in
process and hold it to the contract for a malformed argument list: a non-zero exit, one line on stderr, and no
traceback (an exception other than SystemExit escaping ``main`` fails the test with its own traceback)."""

from __future__ import annotations

import io
import os
import string
from collections import Counter
from contextlib import redirect_stderr, redirect_stdout
from typing import List, Tuple

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from fsdp_matrix import cli

FUZZ = settings(
    # 100 per command in `nox -s tests`; FSDP_MATRIX_FUZZ_EXAMPLES=2000 for a deeper search
    max_examples=int(os.environ.get("FSDP_MATRIX_FUZZ_EXAMPLES", "100")),
    deadline=None,  # a guard against hangs is the pytest timeout on each test, not a speed assertion per example
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# free text as a user (or a script with a bad variable) may pass it: any character but "/", so that a path built
# from it stays inside its temp dir (a bare "/" or "x/../../.." would make a report walk the whole disk)
words = st.text(st.characters(blacklist_characters="/", blacklist_categories=("Cs",)), max_size=40)
tokens = st.one_of(
    words,
    st.sampled_from(["", " ", "-", "--", "-1", "0", "nan", "inf", "1e999", "\n", "a\nb", "\x00", "\u202e", "é" * 300]),
    st.text(string.ascii_letters + string.digits + ".*=<>!~,;@ -_", max_size=30),
)


TRIED: Counter = Counter()
"""Examples checked per command in this process: each test says how many it tried (``pytest -s`` shows it)."""


def run(argv: List[str]) -> Tuple[int, str, str]:
    """Exit code, stdout and stderr of ``python -m fsdp_matrix *argv``."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = cli.main(list(argv))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return code, out.getvalue(), err.getvalue()


def assert_one_line_error(argv: List[str]) -> str:
    TRIED[argv[0]] += 1
    code, out, err = run(argv)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code != 0, f"exit 0 for {argv!r}: {out[-500:]!r}"
    assert len(lines) == 1, f"{len(lines)} lines on stderr for {argv!r}: {err[-1500:]!r}"
    assert "Traceback" not in err + out, f"traceback for {argv!r}"
    return lines[0]


def tried(command: str) -> None:
    """Say how many examples were checked, and fail if none was: a property that never ran proves nothing."""
    print(f"\n{command}: {TRIED[command]} malformed argument lists, each one line, non-zero exit, no traceback")
    assert TRIED[command] > 0
