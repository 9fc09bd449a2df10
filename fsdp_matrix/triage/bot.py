"""An issue bot that speaks only when sure: ``triage --json`` on an opened or edited issue, one comment at strong
evidence, never a close or a label (docs/examples/triage-bot.yml runs it).

``python -m fsdp_matrix.triage.bot`` reads the issue from the environment the workflow sets (``ISSUE_NUMBER``,
``ISSUE_TITLE``, ``ISSUE_BODY``, ``ISSUE_LABELS`` as JSON, ``GITHUB_REPOSITORY``; the body reaches the script through
``env:``, never through a ``run:`` line) or from a webhook payload given with ``--event FILE``. It comments:

- only when triage's first claim is ``strong`` (a likely or weak claim, or none, says nothing: when unsure, leave
  it off, as PyTorch's triage agent does);
- once per issue: its comment carries a hidden marker, and an issue that has one gets no second (an edit re-runs the
  bot; it finds its marker and stops);
- never on an issue labelled ``no-triage-bot`` (a maintainer's off switch), nor on a pull request.

The comment names the case, its upstream report, the releases that fix it, and what works on the versions the issue
states. The GitHub API is reached through ``Client`` (two calls: list comments, create a comment), which the tests
replace with a recorded one: they need no network.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Protocol

from fsdp_matrix.triage import cli as triage_cli

MARKER = "<!-- fsdp-matrix-triage-bot -->"
"""The hidden line of the bot's comment: an issue whose comments hold it is never commented on again."""
OFF_LABEL = "no-triage-bot"
"""A label on the issue that turns the bot off for it."""
API = "https://api.github.com"


@dataclass(frozen=True)
class Issue:
    """What the bot reads of an issue."""

    repository: str
    """``owner/name``."""
    number: int
    """The issue's number."""
    title: str
    """Its title (a title often is the error message)."""
    body: str
    """Its body as written (Markdown)."""
    labels: List[str] = field(default_factory=list)
    """Its labels' names."""
    pull_request: bool = False
    """True for a pull request (the issues API lists them too)."""


class Client(Protocol):
    """The two GitHub calls the bot makes; nothing else (no close, no label)."""

    def comments(self, repository: str, number: int) -> List[str]:
        """The bodies of the issue's comments."""

    def comment(self, repository: str, number: int, body: str) -> None:
        """Add a comment to the issue."""


class GitHub:
    """``Client`` over the REST API with the workflow's token (``issues: write``)."""

    def __init__(self, token: str, api: str = API) -> None:
        self.token, self.api = token, api

    def _call(self, method: str, path: str, data: Optional[Dict[str, Any]] = None) -> Any:
        request = urllib.request.Request(
            f"{self.api}{path}",
            data=json.dumps(data).encode() if data is not None else None,
            method=method,
            headers={
                "Authorization": f"Bearer {self.token}",
                "Accept": "application/vnd.github+json",
                "X-GitHub-Api-Version": "2022-11-28",
            },
        )
        with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310 (a fixed https API)
            return json.loads(response.read() or b"null")

    def comments(self, repository: str, number: int) -> List[str]:
        out: List[str] = []
        for page in range(1, 100):
            batch = self._call("GET", f"/repos/{repository}/issues/{number}/comments?per_page=100&page={page}")
            out += [c.get("body") or "" for c in batch]
            if len(batch) < 100:
                return out
        return out

    def comment(self, repository: str, number: int, body: str) -> None:
        self._call("POST", f"/repos/{repository}/issues/{number}/comments", {"body": body})


def from_event(payload: Dict[str, Any]) -> Issue:
    """The issue of an ``issues`` webhook payload (``opened``, ``edited``)."""
    issue = payload["issue"]
    return Issue(
        repository=payload["repository"]["full_name"],
        number=int(issue["number"]),
        title=issue.get("title") or "",
        body=issue.get("body") or "",
        labels=[label["name"] for label in issue.get("labels") or []],
        pull_request="pull_request" in issue,
    )


def from_env(env: Dict[str, str]) -> Issue:
    """The issue as the workflow passes it through ``env:``."""
    return Issue(
        repository=env["GITHUB_REPOSITORY"],
        number=int(env["ISSUE_NUMBER"]),
        title=env.get("ISSUE_TITLE", ""),
        body=env.get("ISSUE_BODY", ""),
        labels=[str(name) for name in json.loads(env.get("ISSUE_LABELS") or "[]")],
    )


def triage_json(text: str, matrix: Optional[Path] = None) -> Dict[str, Any]:
    """``fsdp_matrix triage --json`` on the text, in this process: the answer as a dict."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "issue.txt"
        path.write_text(text)
        out = io.StringIO()
        argv = [str(path), "--json"] + (["--matrix", str(matrix)] if matrix else [])
        with contextlib.redirect_stdout(out):
            triage_cli.main(argv)
    return json.loads(out.getvalue())


def _fixed_line(fit: Dict[str, Any]) -> str:
    if fit.get("fixed_versions"):
        return ", ".join(f"{p} {v}" for p, v in fit["fixed_versions"].items())
    return fit.get("fixed") or "no release in the matrix fixes it"


def render(answer: Dict[str, Any]) -> Optional[str]:
    """The comment for a strong first claim; None when the bot should stay silent."""
    claims = answer.get("claims") or []
    if not claims or claims[0]["level"] != "strong":
        return None
    claim, fit = claims[0], (claims[0].get("fits") or [{}])[0]
    stated = answer.get("versions_from") == "stated in the paste"
    versions = ", ".join(f"{p} {v}" for p, v in (answer.get("versions") or {}).items() if v)
    works = claim.get("what_works") or []
    lines = [
        MARKER,
        f"This looks like a known PEFT x FSDP failure: **{claim['case']}**: {claim['title']}",
        "",
        f"- upstream report: {claim['report']}",
        f"- fixed in: {_fixed_line(fit)}",
    ]
    if stated:
        on = f"on the versions this issue states ({versions})"
        lines.append(f"- what works {on}: " + ("; ".join(works) if works else "nothing is known to train there"))
    else:
        lines.append("- the issue states no versions: add them (`pip list`) to learn what works on yours")
    lines += [
        "",
        "Evidence: " + "; ".join(fit.get("evidence") or []),
        "",
        "<sub>Posted once by fsdp-matrix's triage bot, only at strong evidence; a maintainer can turn it off with the "
        f"`{OFF_LABEL}` label. It never closes or labels an issue.</sub>",
    ]
    return "\n".join(lines) + "\n"


def run(issue: Issue, client: Client, matrix: Optional[Path] = None) -> str:
    """Triage one issue and comment at most once; returns what was done, in words."""
    if issue.pull_request:
        return "skipped: a pull request"
    if OFF_LABEL in issue.labels:
        return f"skipped: labelled {OFF_LABEL}"
    if any(MARKER in body for body in client.comments(issue.repository, issue.number)):
        return "skipped: already commented on this issue"
    comment = render(triage_json(f"{issue.title}\n\n{issue.body}\n", matrix))
    if comment is None:
        return "silent: no strong claim"
    client.comment(issue.repository, issue.number, comment)
    return "commented"


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fsdp_matrix.triage.bot", description=__doc__.splitlines()[0])
    p.add_argument("--event", type=Path, help="an issues webhook payload (default: the issue from the environment)")
    p.add_argument("--matrix", type=Path, help="matrix.yaml to use (default: the repo's)")
    args = p.parse_args(argv)
    try:
        issue = from_event(json.loads(args.event.read_text())) if args.event else from_env(dict(os.environ))
        token = os.environ["GITHUB_TOKEN"]
    except (KeyError, ValueError, OSError) as exc:
        print(f"triage-bot: cannot read the issue or the token: {exc!r}", file=sys.stderr)
        return 2
    print(f"triage-bot: {issue.repository}#{issue.number}: {run(issue, GitHub(token), args.matrix)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
