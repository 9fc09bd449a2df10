"""Process environment variables set for the length of a block, then put back as they were."""

from __future__ import annotations

import contextlib
import os
from typing import Iterator, Mapping, Optional


@contextlib.contextmanager
def patched(values: Mapping[str, Optional[str]]) -> Iterator[None]:
    """Set each variable to its value for the block (None unsets it). On exit, each is again what it was before,
    unset included, whether the block returned or raised."""
    saved = {name: os.environ.get(name) for name in values}
    try:
        _apply(values)
        yield
    finally:
        _apply(saved)


def _apply(values: Mapping[str, Optional[str]]) -> None:
    for name, value in values.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
