"""What a cell did in one env, reduced to a signature two bisection steps can compare."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from fsdp_matrix.clip import clip

_ADDRESS = re.compile(r"\b0x[0-9a-fA-F]+\b")
# absolute paths differ per step (every step has its own venv): keep what follows site-packages, else the name
_PATH = re.compile(r"(?:[A-Za-z]:)?(?:[/\\][\w.+@~-]+){2,}")
# standalone numbers only (shapes, ports, pids, versions, ranks); digits inside names such as bfloat16 stay
_NUMBER = re.compile(r"(?<![\w.])[-+]?\d+(?:\.\d+)*(?![\w])")
_SPACE = re.compile(r"\s+")
MESSAGE_LIMIT = 300


def _short_path(match: re.Match[str]) -> str:
    path = match.group(0).replace("\\", "/")
    if "site-packages/" in path:
        return path.split("site-packages/", 1)[1]
    return "<path>/" + path.rsplit("/", 1)[-1]


def normalise_message(message: Optional[str]) -> str:
    """The parts of an error message that identify the failure, without what varies from run to run."""
    if not message:
        return ""
    text = _ADDRESS.sub("0x?", message)
    text = _PATH.sub(_short_path, text)
    text = _NUMBER.sub("N", text)
    text = _SPACE.sub(" ", text).strip()
    return clip(text, MESSAGE_LIMIT)


@dataclass(frozen=True)
class Outcome:
    """What a cell did in one env, reduced to a comparable signature."""

    status: str
    """``ok``, ``error``, ``hang`` or ``crash``."""
    error_type: Optional[str] = None
    """Exception class name when status is ``error``."""
    message: str = ""
    """The normalised error message (see normalise_message); compared, so it must not hold run-to-run noise."""
    verdict: Optional[str] = None
    """The cell's verdict in that env, where the runner judged it (``upgrade``); None for a bare outcome."""

    @classmethod
    def observed(
        cls, status: str, error_type: Optional[str] = None, message: Optional[str] = None, verdict: Optional[str] = None
    ) -> Outcome:
        if status != "error":
            return cls(status, verdict=verdict)
        return cls(status, error_type, normalise_message(message), verdict)

    def describe(self) -> str:
        if self.status != "error":
            text = self.status
        else:
            text = f"{self.error_type}: {self.message}" if self.message else str(self.error_type)
        return clip(f"{self.verdict} ({text})" if self.verdict else text, 100)
