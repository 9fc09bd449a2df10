"""``triage.bot`` on recorded issue payloads (tests/fixtures/triage/bot/), with a recorded GitHub client: no network.

One issue gets a comment (a strong claim), one does not (DeepSpeed ZeRO-3: no claim), and an issue edited after the
bot commented gets no second comment; a labelled issue and a pull request are left alone.
"""

import json
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

from fsdp_matrix.triage import bot

PAYLOADS = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "triage" / "bot"


class Recorded:
    """A GitHub client that keeps every comment in memory; it has no way to close or label."""

    def __init__(self) -> None:
        self.posted: Dict[Tuple[str, int], List[str]] = {}

    def comments(self, repository: str, number: int) -> List[str]:
        return list(self.posted.get((repository, number), []))

    def comment(self, repository: str, number: int, body: str) -> None:
        self.posted.setdefault((repository, number), []).append(body)


def issue(name: str) -> bot.Issue:
    return bot.from_event(json.loads((PAYLOADS / name).read_text()))


def test_a_strong_claim_gets_one_comment_with_the_case_report_and_fix():
    client = Recorded()
    assert bot.run(issue("opened_strong.json"), client) == "commented"
    [body] = client.posted[("hiyouga/LlamaFactory", 3550)]
    assert body.startswith(bot.MARKER)
    assert "**dora-sharded-weight**" in body and "https://github.com/huggingface/peft/issues/1984" in body
    assert "fixed in:" in body and bot.OFF_LABEL in body


def test_another_failure_gets_no_comment():
    client = Recorded()
    assert bot.run(issue("opened_zero3.json"), client) == "silent: no strong claim"
    assert client.posted == {}


def test_an_issue_edited_a_second_time_gets_no_second_comment():
    client = Recorded()
    assert bot.run(issue("opened_strong.json"), client) == "commented"
    assert bot.run(issue("edited_strong.json"), client) == "skipped: already commented on this issue"
    assert bot.run(issue("edited_strong.json"), client) == "skipped: already commented on this issue"
    assert len(client.posted[("hiyouga/LlamaFactory", 3550)]) == 1


@pytest.mark.parametrize("change", ["label", "pull_request"])
def test_the_off_label_and_pull_requests_are_left_alone(change):
    payload = json.loads((PAYLOADS / "opened_strong.json").read_text())
    if change == "label":
        payload["issue"]["labels"] = [{"name": bot.OFF_LABEL}]
    else:
        payload["issue"]["pull_request"] = {"url": "x"}
    client = Recorded()
    assert bot.run(bot.from_event(payload), client).startswith("skipped")
    assert client.posted == {}


def test_what_works_is_said_on_the_versions_the_issue_states():
    """A synthetic edit of the strong payload that states its versions (peft 0.13.2, torch 2.13.0)."""
    payload = json.loads((PAYLOADS / "opened_strong.json").read_text())
    payload["issue"]["body"] += "\n- PEFT version: 0.13.2\n- PyTorch version: 2.13.0\n"
    client = Recorded()
    assert bot.run(bot.from_event(payload), client) == "commented"
    [body] = client.posted[("hiyouga/LlamaFactory", 3550)]
    assert "what works on the versions this issue states (torch 2.13.0, peft 0.13.2): set " in body, body


def test_a_likely_claim_is_not_enough():
    answer = {"claims": [{"case": "x", "title": "t", "report": "r", "level": "likely", "fits": [], "what_works": []}]}
    assert bot.render(answer) is None


def test_the_environment_the_workflow_sets_is_read():
    env = {
        "GITHUB_REPOSITORY": "o/r",
        "ISSUE_NUMBER": "7",
        "ISSUE_TITLE": "t",
        "ISSUE_BODY": "$(rm -rf /) `x`",
        "ISSUE_LABELS": '["bug", "no-triage-bot"]',
    }
    got = bot.from_env(env)
    assert (got.repository, got.number, got.body, got.labels) == ("o/r", 7, "$(rm -rf /) `x`", ["bug", bot.OFF_LABEL])


def test_the_example_workflow_runs_the_bot_on_issues_with_issues_write_only():
    import yaml

    path = Path(__file__).resolve().parents[2] / "docs" / "examples" / "triage-bot.yml"
    data = yaml.safe_load(path.read_text())
    assert data[True] == {"issues": {"types": ["opened", "edited"]}}  # YAML 1.1 reads the key `on` as True
    assert data["permissions"] == {}
    [job] = data["jobs"].values()
    assert job["permissions"] == {"issues": "write"}
    assert "no-triage-bot" in job["if"]
    step = job["steps"][-1]
    assert step["run"] == "python -m fsdp_matrix.triage.bot"
    assert step["env"]["ISSUE_BODY"] == "${{ github.event.issue.body }}"
    assert not any("${{" in str(s.get("run", "")) for s in job["steps"])
