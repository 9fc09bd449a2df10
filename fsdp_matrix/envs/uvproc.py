"""uv as a bounded child process: per-request and overall timeouts, its own process group, dies with the harness.

A stalled index would otherwise hold an install for as long as uv's retries last (observed here: 131 s for one
request with uv's defaults, 30 s x 4 attempts), and a harness killed mid-install (CI timeout, OOM) would leave uv
running, still writing into the env.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional

from fsdp_matrix.clip import clip
from fsdp_matrix.errors import EnvError

HTTP_TIMEOUT = 30
"""uv's per-request timeout (UV_HTTP_TIMEOUT), unless the user set one or FSDP_MATRIX_HTTP_TIMEOUT."""
HTTP_RETRIES = 1
"""uv's retries of a failed request (UV_HTTP_RETRIES), unless the user set them."""
INSTALL_TIMEOUT = 1800.0
"""Bound of one uv run in seconds, unless FSDP_MATRIX_INSTALL_TIMEOUT says otherwise."""


def _load_prctl():
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


# loaded before any fork: the child may only call it, not import anything
_PRCTL = _load_prctl()
_PR_SET_PDEATHSIG = 1


def http_settings(base: Mapping[str, str]) -> Dict[str, str]:
    """uv's per-request timeout and retries, so a stalled index fails in about a minute, with the user's values kept."""
    timeout = base.get("UV_HTTP_TIMEOUT") or base.get("FSDP_MATRIX_HTTP_TIMEOUT") or str(HTTP_TIMEOUT)
    return {"UV_HTTP_TIMEOUT": timeout, "UV_HTTP_RETRIES": base.get("UV_HTTP_RETRIES") or str(HTTP_RETRIES)}


def install_timeout(base: Optional[Mapping[str, str]] = None) -> float:
    """Bound of one whole uv run (FSDP_MATRIX_INSTALL_TIMEOUT, seconds); a CUDA torch is a ~3 GB download."""
    value = (os.environ if base is None else base).get("FSDP_MATRIX_INSTALL_TIMEOUT")
    try:
        return float(value) if value else INSTALL_TIMEOUT
    except ValueError:
        raise EnvError(f"FSDP_MATRIX_INSTALL_TIMEOUT={value!r}: expected seconds") from None


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL)


def tail(text: str, lines: int = 40) -> str:
    """The last lines of installer output, without uv's "Using Python ... environment at" preamble."""
    kept = [line for line in text.strip().splitlines() if not line.startswith("Using Python ")]
    return clip("\n".join(kept), lines=lines, tail=True)


@dataclass
class UvRun:
    """What one uv command did."""

    returncode: Optional[int]
    """uv's exit status; None when it was stopped at the deadline."""
    output: str
    """stdout and stderr together."""
    timeout: float
    """The deadline it ran under, in seconds."""


def kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_uv(args: List[str], env: Mapping[str, str], timeout: float) -> UvRun:
    """``uv ARGS`` in its own process group, bounded by ``timeout``: on the deadline, or on any exception here
    (Ctrl-C included), the whole group is killed. On Linux uv also gets SIGKILL when this process dies."""
    try:
        proc = subprocess.Popen(
            ["uv", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, **env},
            start_new_session=True,
            preexec_fn=_die_with_parent if _PRCTL is not None else None,
        )
    except FileNotFoundError:
        raise EnvError("uv is not installed: python -m pip install 'nox[uv]' (or uv)") from None
    start = time.monotonic()
    try:
        while True:
            try:
                out, _ = proc.communicate(timeout=0.5)
                return UvRun(proc.returncode, out, timeout)
            except subprocess.TimeoutExpired:
                if time.monotonic() - start > timeout:
                    kill_group(proc)
                    out, _ = proc.communicate()
                    return UvRun(None, out, timeout)
    finally:
        if proc.poll() is None:
            kill_group(proc)
            proc.wait()


def failure(run: UvRun, what: str, env: Mapping[str, str]) -> str:
    """The env-error text of a failed uv run: a deadline, an index that did not answer, or uv's own message."""
    if run.returncode is None:
        return (
            f"{what} did not finish within {run.timeout:.0f}s (FSDP_MATRIX_INSTALL_TIMEOUT) and was stopped; "
            f"uv's last output: {tail(run.output, 5) or '(none)'}"
        )
    if "operation timed out" in run.output or "Request failed after" in run.output:
        urls = re.findall(r"Failed to fetch: (\S+)", run.output)
        where = f" ({urls[-1]})" if urls else ""
        return (
            f"the package index did not answer{where} within {env.get('UV_HTTP_TIMEOUT')}s per request "
            f"(UV_HTTP_TIMEOUT, {env.get('UV_HTTP_RETRIES')} retries): check the index configuration and the "
            f"network. uv said: {tail(run.output, 6)}"
        )
    return tail(run.output)
