"""Source builds that nox did not make: a package under test installed by the caller from a VCS URL or a local
checkout (``pip install -e ../peft``, ``pip install "peft @ git+URL@REF"``), found through its PEP 610
``direct_url.json`` (https://packaging.python.org/en/latest/specifications/direct-url-data-structure/).

A record carries such a build in ``sources`` exactly as it carries a nox source pin's (fsdp_matrix/envs/sources.py):
``{url, ref, commit, dirty, release}``, so a verdict on unreleased code names the commit it was made on, and the
rules judge a checkout as its release base.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Mapping, Optional
from urllib.parse import unquote, urlparse

from fsdp_matrix.envs.sources import env_sources, git, redact_url, release_base, tree_hash, working_files
from fsdp_matrix.errors import EnvError
from fsdp_matrix.installed import direct_url


def _checkout(path: Path) -> Optional[Dict[str, Any]]:
    """``{commit, dirty, release}`` of a local git checkout at ``path`` (its top), as a nox source pin of a working
    tree records them; None when ``path`` is not the top of a git checkout."""
    try:
        top = git(path, "rev-parse", "--show-toplevel", check=False)
        if not top or Path(top).resolve() != path.resolve():
            return None
        commit = git(path, "rev-parse", "--verify", "HEAD^{commit}")
        dirty = tree_hash(path, working_files(path)) if git(path, "status", "--porcelain") else None
        return {"commit": commit, "dirty": dirty, "release": release_base(path, commit)}
    except (EnvError, OSError):  # no git on PATH, an unreadable folder: the version alone is recorded
        return None


def source_of(name: str) -> Optional[Dict[str, Any]]:
    """The record's ``sources`` entry (``{url, ref, commit, dirty, release}``) of a package installed from a VCS URL
    or a local git checkout (editable or not); None for a release, an archive, or a folder outside git: nothing
    names a commit there, and the installed version is all a record can say."""
    data = direct_url(name)
    if data is None:
        return None
    url = data["url"]
    vcs = data.get("vcs_info")
    if isinstance(vcs, dict) and isinstance(vcs.get("commit_id"), str):
        ref = vcs.get("requested_revision")
        # no checkout to read tags from: the rules judge it as its installed version (a .dev0 sorts below its release)
        return {"url": redact_url(url), "ref": ref, "commit": vcs["commit_id"], "dirty": None, "release": None}
    if isinstance(data.get("dir_info"), dict) and url.startswith("file:"):
        found = _checkout(Path(unquote(urlparse(url).path)))
        return {"url": url, "ref": None, **found} if found else None
    return None


def installed_sources(versions: Mapping[str, Optional[str]]) -> Dict[str, Dict[str, Any]]:
    """The source builds among ``versions``' packages: what a nox env recorded of its source pins
    (``envs.sources.env_sources``), else what each package's ``direct_url.json`` says."""
    out = env_sources(versions=versions)
    for name, version in versions.items():
        if name != "python" and version is not None and name not in out:
            found = source_of(name)
            if found is not None:
                out[name] = found
    return out
