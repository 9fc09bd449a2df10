"""Source builds the caller installed (PEP 610 direct URLs): what a record says of them."""

from __future__ import annotations

from pathlib import Path

import pytest

from fsdp_matrix.envs import direct
from tests.sources_support import make_toy_repo
from tests.test_installed import fake_dist


def test_a_release_from_an_index_has_no_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_dist(tmp_path, "peft", "0.13.2")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert direct.direct_url("peft") is None and direct.source_of("peft") is None
    assert direct.installed_sources({"peft": "0.13.2", "python": "3.11.7"}) == {}


def test_a_vcs_install_records_its_commit_and_hides_credentials(tmp_path: Path, monkeypatch) -> None:
    url = "https://user:tok@github.com/huggingface/peft"
    vcs = {"url": url, "vcs_info": {"vcs": "git", "requested_revision": "main", "commit_id": "c" * 40}}
    fake_dist(tmp_path, "peft", "0.18.0.dev0", vcs)
    monkeypatch.syspath_prepend(str(tmp_path))
    got = direct.installed_sources({"peft": "0.18.0.dev0"})["peft"]
    assert got == {"url": "https://***@github.com/huggingface/peft", "ref": "main", "commit": "c" * 40,
                   "dirty": None, "release": None}  # fmt: skip


def test_an_editable_checkout_records_head_its_release_and_a_dirty_tree(tmp_path: Path, monkeypatch) -> None:
    shas = make_toy_repo(tmp_path / "peft")
    fake_dist(
        tmp_path / "site", "peft", "0.2.0.dev0", {"url": (tmp_path / "peft").as_uri(), "dir_info": {"editable": True}}
    )
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    got = direct.source_of("peft")
    assert got == {"url": (tmp_path / "peft").as_uri(), "ref": None, "commit": shas["c5"], "dirty": None,
                   "release": "0.2.0"}  # fmt: skip
    (tmp_path / "peft" / "toypkg" / "__init__.py").write_text("def behave():\n    return 43\n")
    assert direct.source_of("peft")["dirty"]  # a working tree that differs from HEAD says so


def test_a_folder_outside_git_and_an_archive_name_no_commit(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "plain").mkdir()
    fake_dist(tmp_path / "a", "peft", "0.1", {"url": (tmp_path / "plain").as_uri(), "dir_info": {}})
    fake_dist(tmp_path / "b", "trl", "0.1", {"url": "https://example.org/trl-0.1.tar.gz", "archive_info": {}})
    monkeypatch.syspath_prepend(str(tmp_path / "a"))
    monkeypatch.syspath_prepend(str(tmp_path / "b"))
    assert direct.source_of("peft") is None and direct.source_of("trl") is None


def test_a_nox_source_pin_wins_over_direct_url(tmp_path: Path, monkeypatch) -> None:
    """nox's env file knows the repository behind its snapshot folder; direct_url.json only names the snapshot."""
    pinned = {"url": "/clone", "ref": "main", "commit": "a" * 40, "dirty": None, "release": "0.14.0"}
    monkeypatch.setattr(direct, "env_sources", lambda prefix=None, versions=None: {"peft": dict(pinned)})
    fake_dist(tmp_path, "peft", "0.15.0.dev0", {"url": "https://h/peft", "vcs_info": {"vcs": "git", "commit_id": "b"}})
    monkeypatch.syspath_prepend(str(tmp_path))
    assert direct.installed_sources({"peft": "0.15.0.dev0"}) == {"peft": pinned}
