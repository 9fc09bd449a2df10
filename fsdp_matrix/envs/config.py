"""The package-index configuration uv is given: the user's uv settings, else pip's translated to uv's variables.

uv does not read pip's configuration, and with no index configured it resolves ``torch`` to the multi-GB CUDA build.
So the user's pip settings (find-links, index-url, extra-index-url) are translated to uv's environment variables,
unless the user already configured uv itself.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from typing import Dict, Mapping, Optional

from fsdp_matrix.envs.uvproc import http_settings

_UV_INDEX_VARS = ("UV_INDEX", "UV_INDEX_URL", "UV_DEFAULT_INDEX", "UV_EXTRA_INDEX_URL", "UV_FIND_LINKS")


def pip_config(python: Optional[str] = None) -> Dict[str, str]:
    """pip's effective settings (``pip config list``), keyed without their scope: ``find-links``, ``index-url``...

    Without ``python``, the first interpreter that has pip answers: uv-built envs (nox's own included) have no
    pip, and reading nothing there would lose the user's find-links and send uv to the CUDA build of torch.
    """
    if python is None:
        return dict(_discovered_pip_config())
    try:
        out = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    # pip lists env settings as ":env:.key"; they override the files, so read them last
    rows = [line.split("=", 1) for line in out.splitlines() if "=" in line]
    rows.sort(key=lambda kv: kv[0].startswith(":env:"))
    config: Dict[str, str] = {}
    for key, value in rows:
        config[key.split(".", 1)[-1].strip()] = value.strip().strip("'\"")
    return config


@functools.cache
def _discovered_pip_config() -> Dict[str, str]:
    # one `pip config list` per process: every install of a bisect or matrix run would otherwise ask again
    for candidate in dict.fromkeys(
        p
        for p in (
            sys.executable,
            getattr(sys, "_base_executable", None),
            shutil.which("python3"),
            shutil.which("python"),
        )
        if p
    ):
        config = pip_config(candidate)
        if config:
            return config
    return {}


def uv_environment(base: Optional[Mapping[str, str]] = None, pip: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """Environment variables that make uv see the same indexes pip would, plus bytecode compilation.

    A user who configured uv (any UV_INDEX* / UV_FIND_LINKS variable) keeps exactly that configuration.
    """
    base = dict(os.environ if base is None else base)
    env: Dict[str, str] = {"UV_COMPILE_BYTECODE": base.get("UV_COMPILE_BYTECODE", "1"), **http_settings(base)}
    if any(base.get(v) for v in _UV_INDEX_VARS):
        return env
    pip = pip_config() if pip is None else pip
    if pip.get("index-url"):
        env["UV_DEFAULT_INDEX"] = pip["index-url"]
    if pip.get("extra-index-url"):
        env["UV_EXTRA_INDEX_URL"] = " ".join(pip["extra-index-url"].split())
    if pip.get("find-links"):
        env["UV_FIND_LINKS"] = ",".join(pip["find-links"].split())
    if "UV_EXTRA_INDEX_URL" in env or "UV_FIND_LINKS" in env:
        # pip takes the best version across all indexes; uv's default stops at the first index that has the name,
        # which would hide e.g. peft 0.21.2 behind a local mirror that only holds 0.21.0
        env.setdefault("UV_INDEX_STRATEGY", base.get("UV_INDEX_STRATEGY", "unsafe-best-match"))
    return env
