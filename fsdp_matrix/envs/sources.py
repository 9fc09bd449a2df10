"""Source pins: a package under test built from a git ref or a local checkout instead of a release on an index.

A source pin is a PEP 508 direct reference (``peft @ git+file:///clone@main``, ``git+https://host/peft@v0.14.0``,
a ``file:`` URL of a checkout) or the short form ``PATH``, ``PATH@REF``. It is resolved with git to a commit, then
materialised as a snapshot directory named by what it holds, and uv installs that directory:

- ``URL@REF`` / ``PATH@REF``: REF's tree (``git archive``), never the checkout's working state;
- a bare ``PATH``: the working tree as it is, dirty or not; ``dirty`` is a hash of the tracked files and the
  untracked files that are not ignored (``git ls-files -co --exclude-standard``).

Because the snapshot's path holds the commit and the dirty hash, an env whose stamp keys on the requirement is
reinstalled exactly when the branch moved or the tree changed. A remote URL is mirrored once into the cache (git
fetch refreshes it) so that resolving, archiving and finding the release base are all local git commands.

Rules are written for releases: a source build is judged as the newest release tag (``v*``, no pre-release) that
is an ancestor of its commit, and its record says so (``sources.<pkg>.release``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple
from urllib.parse import unquote, urlparse, urlsplit, urlunsplit

from packaging.utils import canonicalize_name

from fsdp_matrix.errors import EnvError

# git itself is asked through fsdp_matrix.git; these names stay importable from here for older callers
from fsdp_matrix.git import archive, git, is_repository, mirror, pr_number, release_base, rev, working_files  # noqa: F401
from fsdp_matrix.rules import REFUSED

SOURCE_PACKAGES = ("peft", "transformers", "accelerate", "trl")
"""Pure-Python packages under test that build from source in seconds (any other pure-Python package works too)."""
SOURCES_FILE = "fsdp-matrix-sources.json"
"""Written into an env next to its stamp: which packages came from which source (read back by records)."""
_REQ = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*@\s*(\S+)\s*$")
_HIDDEN = "***"
"""What a URL shows in place of its credentials."""
_HELPER = (
    '!f() { test "$1" = get && printf "username=%s\\npassword=%s\\n" '
    '"$FSDP_MATRIX_GIT_USERNAME" "$FSDP_MATRIX_GIT_PASSWORD"; }; f'
)
"""A git credential helper that answers from the environment of the one git command that needs it (see
https://git-scm.com/docs/gitcredentials#_custom_helpers): the credentials are never written to a config file."""


@dataclass(frozen=True)
class SourcePin:
    """A package to build from a git repository or a local checkout."""

    package: str
    """Canonical package name."""
    repo: str
    """Where the source lives: a local path (absolute) or a git URL (https, ssh, file)."""
    ref: Optional[str] = None
    """Branch, tag or commit; None builds a local checkout's working tree as it is (a remote's default branch)."""

    @property
    def local(self) -> bool:
        return not re.match(r"^[a-z+]+://", self.repo) or self.repo.startswith("file://")

    def describe(self) -> str:
        return f"{self.repo}@{self.ref}" if self.ref else self.repo


@dataclass(frozen=True)
class Resolved:
    """A source pin resolved to one commit (and, for a dirty working tree, one content hash)."""

    package: str
    """Canonical package name."""
    url: str
    """The repository as given (a path or URL), its credentials redacted (``redact_url``)."""
    ref: Optional[str]
    """The ref asked for; None for a working tree."""
    commit: str
    """Full SHA the build is from (HEAD of a working tree)."""
    dirty: Optional[str] = None
    """Hash of a working tree that differs from ``commit`` (tracked + untracked-not-ignored files); None if clean."""
    release: Optional[str] = None
    """The newest release tag that is an ancestor of ``commit``, as a version: what the rules judge it as."""
    snapshot: str = ""
    """The directory uv installs (under the cache, named by commit and dirty hash)."""

    @property
    def key(self) -> str:
        return f"{self.package}@{self.commit}" + (f"+{self.dirty}" if self.dirty else "")

    @property
    def requirement(self) -> str:
        return f"{self.package} @ {Path(self.snapshot).as_uri()}"

    def to_record(self) -> Dict[str, Any]:
        return {"url": self.url, "ref": self.ref, "commit": self.commit, "dirty": self.dirty, "release": self.release}

    def short(self) -> str:
        return self.commit[:7] + ("+dirty" if self.dirty else "")


def redact_url(url: str) -> str:
    """``url`` as it may be shown or stored: ``https://user:TOKEN@host/x`` -> ``https://***@host/x``. Every URL of a
    source goes through here before a record, a report, a log line, a JSON answer or an env file holds it. An ssh
    user without a password (``ssh://git@host``) is no secret and is kept; a path is returned as it is."""
    parts = urlsplit(url) if "://" in url else None
    if parts is None or "@" not in parts.netloc:
        return url
    user, _, host = parts.netloc.rpartition("@")
    if parts.scheme.endswith("ssh") and ":" not in user:
        return url
    return urlunsplit(parts._replace(netloc=f"{_HIDDEN}@{host}"))


def credentials(url: str) -> Tuple[str, Dict[str, str]]:
    """(``url`` without its credentials, the environment that hands them to git's credential helper). A redacted
    URL (``***@``) carries none: git then asks the user's own helpers, as for any URL."""
    parts = urlsplit(url) if "://" in url else None
    if parts is None or "@" not in parts.netloc or redact_url(url) == url:
        return url, {}
    user, _, host = parts.netloc.rpartition("@")
    clean = urlunsplit(parts._replace(netloc=host))
    name, _, password = user.partition(":")
    if name == _HIDDEN:
        return clean, {}
    # GIT_CONFIG_COUNT: config for this one command (git >= 2.31); the empty helper first drops configured ones
    env = {"GIT_CONFIG_COUNT": "2", "GIT_CONFIG_KEY_0": "credential.helper", "GIT_CONFIG_VALUE_0": ""}
    env.update({"GIT_CONFIG_KEY_1": "credential.helper", "GIT_CONFIG_VALUE_1": _HELPER, "GIT_TERMINAL_PROMPT": "0"})
    env.update({"FSDP_MATRIX_GIT_USERNAME": unquote(name), "FSDP_MATRIX_GIT_PASSWORD": unquote(password)})
    return clean, env


def is_source(text: str) -> bool:
    """True when a pin's value is a source (path, URL, direct reference), not a version."""
    text = text.strip()
    return "://" in text or "/" in text or text.startswith((".", "~")) or bool(_REQ.match(text))


def _split_remote(url: str) -> Tuple[str, Optional[str]]:
    # the ref follows the last '@' of the path part (user@host comes before the path); a ref may hold '/'
    scheme, sep, rest = url.partition("://")
    netloc, slash, path = rest.partition("/")
    head, at, ref = path.rpartition("@")
    if at and head and ref:
        return f"{scheme}{sep}{netloc}{slash}{head}", ref
    return url, None


def _split_local(where: str, base: Path) -> Tuple[Optional[Path], Optional[str]]:
    """(the path, the ref) of ``PATH[@REF]``: a ref (``fix/x`` too) follows an '@' only where what comes before it
    exists, so that a folder whose name holds '@' is a path; (None, None) when no reading names an existing path."""
    tails = [i for i, c in enumerate(where) if c == "@"]
    for head, ref in [(where, None)] + [(where[:i], where[i + 1 :]) for i in reversed(tails)]:
        if head and (ref is None or ref):
            path = (base / Path(head).expanduser()).resolve()
            if path.exists():
                return path, ref
    return None, None


def parse_source(package: str, text: str, base: Optional[Path] = None) -> SourcePin:
    """``git+URL[@REF]``, a ``file:`` URL, ``PATH[@REF]`` or ``NAME @ <one of those>`` -> a SourcePin.

    Raises EnvError (one line) for torch/bitsandbytes (native builds take hours here) or a missing path.
    """
    name = canonicalize_name(package)
    match = _REQ.match(text)
    if match:
        if canonicalize_name(match.group(1)) != name:
            raise EnvError(f"pin {package}: the direct reference names {match.group(1)!r}")
        text = match.group(2)
    shown = redact_url(text)
    if name in REFUSED:
        raise EnvError(f"pin {package}={shown}: {package} from source is refused ({REFUSED[name]}); pin a release")
    where = text.strip().removeprefix("git+")
    if where.startswith("file://"):
        where = unquote(urlparse(where).path)
    elif re.match(r"^[a-z+]+://", where):
        return SourcePin(name, *_split_remote(where))
    path, ref = _split_local(where, Path(base or Path.cwd()))
    if path is None:
        missing = (Path(base or Path.cwd()) / Path(where.partition("@")[0] or where).expanduser()).resolve()
        raise EnvError(f"pin {package}={shown}: no such path {missing}")
    return SourcePin(name, str(path), ref)


def parse_pin_arg(text: str, base: Optional[Path] = None) -> Tuple[str, SourcePin]:
    """``--pin peft=../peft@main`` or ``--pin 'peft @ git+file:///clone@v0.14.0'`` -> (name, SourcePin)."""
    match = _REQ.match(text)
    if match:
        return canonicalize_name(match.group(1)), parse_source(match.group(1), text, base)
    name, eq, value = text.partition("=")
    if not eq or not name.strip() or not value.strip() or value.startswith("="):
        raise EnvError(f"--pin {text!r}: expected NAME=PATH[@REF], NAME=git+URL[@REF] or 'NAME @ URL'")
    return canonicalize_name(name.strip()), parse_source(name.strip(), value.strip(), base)


def default_cache() -> Path:
    return Path(os.environ.get("FSDP_MATRIX_SOURCE_CACHE") or Path(tempfile.gettempdir()) / "fsdp-matrix-sources")


def repository(pin: SourcePin, cache: Path) -> Path:
    """A local git dir for the pin: the path itself, or a mirror of a remote URL under the cache (fetched again)."""
    if pin.local:
        return Path(pin.repo)
    # the mirror's config holds the URL without credentials; they reach git through its credential helper
    url, env = credentials(pin.repo)
    return mirror(url, cache / "git" / hashlib.sha256(url.encode()).hexdigest()[:16], env)


def tree_hash(repo: Path, files: List[str]) -> str:
    digest = hashlib.sha256()
    for name in files:
        path = repo / name
        data = os.readlink(path).encode() if path.is_symlink() else path.read_bytes()
        mode = b"x" if os.access(path, os.X_OK) and not path.is_symlink() else b"-"
        digest.update(name.encode() + b"\0" + mode + hashlib.sha256(data).digest())
    return digest.hexdigest()[:16]


def _copy_tree(repo: Path, files: List[str], dest: Path) -> None:
    tmp = Path(tempfile.mkdtemp(prefix=dest.name + ".", dir=dest.parent))
    try:
        for name in files:
            target = tmp / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(repo / name, target, follow_symlinks=False)
        os.replace(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def resolve(pin: SourcePin, cache: Optional[Path] = None) -> Resolved:
    """Resolve the pin to a commit (+ dirty hash) and materialise its snapshot under the cache (reused if there)."""
    cache = cache or default_cache()
    repo = repository(pin, cache)
    if not is_repository(repo):
        raise EnvError(f"{pin.package} source {redact_url(pin.repo)}: not a git repository")
    dirty: Optional[str] = None
    files: List[str] = []
    top = git(repo, "rev-parse", "--show-toplevel", check=False) if pin.local else ""
    if top and Path(top).resolve() != Path(repo).resolve():
        raise EnvError(f"{pin.package} source {repo}: not the top of a git repository (that is {top})")
    if pin.ref is None and pin.local and git(repo, "rev-parse", "--is-bare-repository") == "false":
        commit = rev(repo, "HEAD")
        if git(repo, "status", "--porcelain", "--untracked-files=normal"):
            files = working_files(repo)
            dirty = tree_hash(repo, files)
    else:
        commit = rev(repo, pin.ref or "HEAD")
    snapshot = cache / "src" / (f"{pin.package}-{commit[:12]}" + (f"-{dirty}" if dirty else ""))
    if not snapshot.is_dir():
        snapshot.parent.mkdir(parents=True, exist_ok=True)
        if dirty:
            _copy_tree(repo, files, snapshot)
        else:
            archive(repo, commit, snapshot)
    base = release_base(repo, commit)
    return Resolved(pin.package, redact_url(pin.repo), pin.ref, commit, dirty, base, str(snapshot))


def write_env_sources(venv: Path, resolved: Mapping[str, Resolved], versions: Mapping[str, Optional[str]]) -> None:
    """Record in the env which packages came from which source (with the version that got installed); none: remove
    the file, so a release installed over a source build is never reported as that source."""
    if not resolved:
        (venv / SOURCES_FILE).unlink(missing_ok=True)
        return
    data = {name: {**src.to_record(), "version": versions.get(name)} for name, src in resolved.items()}
    tmp = venv / f"{SOURCES_FILE}.tmp"
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, venv / SOURCES_FILE)


def env_sources(prefix: Optional[Path] = None, versions: Optional[Mapping[str, Optional[str]]] = None) -> Dict:
    """``{pkg: {url, ref, commit, dirty, release}}`` of this env (``sys.prefix``); a package reinstalled since (its
    version differs from what the source build installed) is left out."""
    try:
        data = json.loads((Path(prefix or sys.prefix) / SOURCES_FILE).read_text())
    except (OSError, ValueError):
        return {}
    out = {}
    for name, entry in data.items() if isinstance(data, dict) else ():
        if versions is None or versions.get(name) == entry.get("version"):
            out[name] = {k: v for k, v in entry.items() if k != "version"}
            if isinstance(out[name].get("url"), str):  # an env file written before URLs were redacted
                out[name]["url"] = redact_url(out[name]["url"])
    return out


def rule_versions(versions: Mapping[str, Optional[str]], sources: Mapping[str, Mapping]) -> Dict[str, Optional[str]]:
    """The versions rules are matched against: a source build counts as its release base (see the module doc)."""
    out = dict(versions)
    for name, src in sources.items():
        if src.get("release"):
            out[name] = src["release"]
    return out


def shown(version: Optional[str], source: Optional[Mapping]) -> Optional[str]:
    """``0.18.0.dev0 @ 04d41cb`` for a source build, the version otherwise."""
    if not source or not source.get("commit"):
        return version
    return f"{version or '?'} @ {source['commit'][:7]}" + ("+dirty" if source.get("dirty") else "")


def resolve_pins(texts: List[str], cache: Optional[Path] = None) -> Dict[str, Resolved]:
    """``--pin NAME=PATH_OR_URL[@REF]`` (repeatable) resolved once per run: the same commit for every combo."""
    parsed = [parse_pin_arg(text) for text in texts]  # every pin parses before any is cloned
    out: Dict[str, Resolved] = {}
    for name, pin in parsed:
        if name in out:
            raise EnvError(f"--pin {name}: {name} pinned twice; give one source")
        out[name] = resolve(pin, cache)
    return out


def overlay_line(pins: Mapping[str, str], resolved: Mapping[str, Resolved]) -> str:
    """``peft==0.13.2 replaced by /clone@v0.14.0 (de88c70, rules of 0.14.0)`` for each source pin."""
    return "; ".join(
        f"{name}=={pins.get(name, '-')} replaced by {src.url}{'@' + src.ref if src.ref else ''} "
        f"({src.short()}, rules of {src.release or 'no release'})"
        for name, src in resolved.items()
    )


def failure_line(resolved: Mapping[str, Resolved], message: str) -> str:
    """One line for an env with source pins that could not be built or resolved: the refs and the last error line
    (uv's conflict explanation, or the build backend's error)."""
    lines = [line.strip(" │╰─▶×") for line in message.splitlines() if line.strip(" │╰─▶×")]
    refs = ", ".join(f"{n} {s.url}{'@' + s.ref if s.ref else ''} ({s.short()})" for n, s in resolved.items())
    return f"{refs}: {lines[-1] if lines else 'install failed'}"
