"""Usage errors as one line: an ArgumentParser that does not print its (multi-line) usage before the error, and the
checks shared by commands whose arguments are not launch options."""

from __future__ import annotations

import argparse
import math
import re
from typing import NoReturn

# C0 and C1 controls and the Unicode line and paragraph separators: each may end a line, or start a terminal sequence
_BREAKS = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def flat(text: object) -> str:
    """``text`` on one line: every control character (newlines included) written as ``\\xNN`` or ``\\uNNNN``."""
    return _BREAKS.sub(lambda m: ascii(m.group())[1:-1], str(text))


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line, ``PROG: error: MESSAGE (see PROG --help)``, exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {flat(message)} (see {self.prog} --help)\n")


def positive_seconds(text: str) -> float:
    """An argparse type: a finite number of seconds above zero."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a number of seconds above 0")
    return value
