"""A toy package in a real git repository, for source pins and the commit bisect (no network, never a real clone).

History of ``make_toy_repo`` (first parent, oldest first), with the behaviour of ``toypkg.behave()``:

    c0  v0.1.0  raises RuntimeError("toy bug present")
    c1          docs
    c2          docs
    c3          pyproject.toml broken: does not build
    c4          "Fix the toy bug (#42)": returns 42
    c5  v0.2.0  docs

and a release branch off c0: ``v0.1.1`` (docs backport, still the bug) and ``v0.1.2`` (the fix backported).
"""

from __future__ import annotations

import base64
import http.server
import shutil
import subprocess
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

PYPROJECT = """[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "toypkg"
version = "{version}"
"""
BUG = 'def behave():\n    raise RuntimeError("toy bug present")\n'
FIXED = "def behave():\n    return 42\n"


def git(repo: Path, *args: str) -> str:
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.com",
        "GIT_AUTHOR_DATE": "2024-01-01T00:00:00+00:00",
        "GIT_COMMITTER_DATE": "2024-01-01T00:00:00+00:00",
        "PATH": "/usr/bin:/bin:/usr/local/bin",
        "HOME": str(repo),
    }
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=env
    ).stdout.strip()


def write(repo: Path, files: Dict[str, str]) -> None:
    for name, text in files.items():
        path = repo / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def commit(repo: Path, message: str, files: Dict[str, str]) -> str:
    write(repo, files)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


def make_toy_repo(repo: Path) -> Dict[str, str]:
    """Build the history above; returns name -> full SHA (c0..c5, v0.1.1, v0.1.2)."""
    repo.mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    shas: Dict[str, str] = {}
    base = {"pyproject.toml": PYPROJECT.format(version="0.2.0.dev0"), ".gitignore": "*.log\n"}
    shas["c0"] = commit(repo, "Toy package (#1)", {**base, "toypkg/__init__.py": BUG, "README": "toy\n"})
    git(repo, "tag", "v0.1.0")
    shas["c1"] = commit(repo, "Docs one (#2)", {"README": "toy\none\n"})
    shas["c2"] = commit(repo, "Docs two (#3)", {"README": "toy\none\ntwo\n"})
    shas["c3"] = commit(repo, "Break the build (#4)", {"pyproject.toml": "[project\nname = broken\n"})
    shas["c4"] = commit(
        repo, "Fix the toy bug (#42)", {"pyproject.toml": base["pyproject.toml"], "toypkg/__init__.py": FIXED}
    )
    shas["c5"] = commit(repo, "Docs three (#5)", {"README": "toy\none\ntwo\nthree\n"})
    git(repo, "tag", "v0.2.0")
    git(repo, "checkout", "-q", "-b", "release-0.1", shas["c0"])
    shas["v0.1.1"] = commit(repo, "Backport docs", {"README": "toy\npatch\n"})
    git(repo, "tag", "v0.1.1")
    shas["v0.1.2"] = commit(repo, "Backport the fix", {"toypkg/__init__.py": FIXED})
    git(repo, "tag", "v0.1.2")
    git(repo, "tag", "v0.1.3rc1")
    git(repo, "checkout", "-q", "main")
    return shas


@contextmanager
def auth_git_server(repo: Path, user: str, token: str) -> Iterator[Tuple[str, List[str]]]:
    """A bare clone of ``repo`` served over git's dumb HTTP protocol that answers 401 unless the request carries
    ``user:token`` as HTTP basic auth: yields (its URL, the Authorization headers received)."""
    served = Path(tempfile.mkdtemp(prefix="httpgit-"))
    subprocess.run(["git", "clone", "-q", "--bare", str(repo), str(served / "toy.git")], check=True)
    subprocess.run(["git", "-C", str(served / "toy.git"), "update-server-info"], check=True)
    wanted = "Basic " + base64.b64encode(f"{user}:{token}".encode()).decode()
    seen: List[str] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, directory=str(served), **kwargs)

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            seen.append(self.headers.get("Authorization") or "")
            if seen[-1] != wanted:
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Basic realm="toy"')
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            super().do_GET()

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/toy.git", seen
    finally:
        server.shutdown()
        server.server_close()
        shutil.rmtree(served, ignore_errors=True)


def files_holding(root: Path, needle: bytes) -> List[str]:
    """Every file under ``root`` whose bytes hold ``needle`` (a leaked token)."""
    return sorted(str(p) for p in root.rglob("*") if p.is_file() and not p.is_symlink() and needle in p.read_bytes())
