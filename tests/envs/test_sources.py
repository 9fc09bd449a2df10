"""Source pins on a toy git repository: parsing, resolving to a commit, dirty trees, release base, env stamps."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from fsdp_matrix import envs
from fsdp_matrix.envs import sources
from fsdp_matrix.errors import EnvError
from fsdp_matrix.records import SCHEMA
from tests.sources_support import FIXED, auth_git_server, files_holding, git, make_toy_repo


@pytest.fixture(scope="module")
def toy(tmp_path_factory: pytest.TempPathFactory):
    repo = tmp_path_factory.mktemp("toy") / "toypkg"
    return repo, make_toy_repo(repo)


@pytest.mark.parametrize(
    "text, repo, ref",
    [
        ("git+https://github.com/huggingface/peft@main", "https://github.com/huggingface/peft", "main"),
        ("git+https://github.com/huggingface/peft", "https://github.com/huggingface/peft", None),
        ("git+ssh://git@github.com/huggingface/peft@v0.14.0", "ssh://git@github.com/huggingface/peft", "v0.14.0"),
        ("peft @ git+https://github.com/huggingface/peft@abc123", "https://github.com/huggingface/peft", "abc123"),
    ],
)
def test_parse_remote_forms(text: str, repo: str, ref: str) -> None:
    pin = sources.parse_source("peft", text)
    assert (pin.package, pin.repo, pin.ref, pin.local) == ("peft", repo, ref, False)


def test_parse_local_forms(toy, tmp_path: Path) -> None:
    repo, _ = toy
    for text, ref in [
        (f"git+file://{repo}@v0.1.0", "v0.1.0"),
        (f"file://{repo}", None),
        (f"peft @ file://{repo}", None),
        (str(repo), None),
        (f"{repo}@main", "main"),
    ]:
        pin = sources.parse_source("peft", text)
        assert (pin.repo, pin.ref, pin.local) == (str(repo), ref, True), text
    name, pin = sources.parse_pin_arg("peft=../toypkg@v0.1.0", base=repo.parent / "elsewhere")
    assert (name, pin.repo, pin.ref) == ("peft", str(repo), "v0.1.0")


@pytest.mark.parametrize("package", ["torch", "bitsandbytes"])
def test_torch_and_bitsandbytes_from_source_are_refused_in_one_line(package: str, toy) -> None:
    with pytest.raises(EnvError, match=f"{package} from source is refused") as info:
        sources.parse_pin_arg(f"{package}={toy[0]}")
    assert "\n" not in str(info.value)


def test_bad_pins_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(EnvError, match="no such path"):
        sources.parse_source("peft", str(tmp_path / "missing"))
    with pytest.raises(EnvError, match="expected NAME=PATH"):
        sources.parse_pin_arg("peft")
    with pytest.raises(EnvError, match="names 'trl'"):
        sources.parse_source("peft", "trl @ git+https://x/y")


def test_is_source() -> None:
    assert not sources.is_source("0.14.0")
    assert all(sources.is_source(t) for t in ("../peft", "git+https://x/y@main", "peft @ file:///p", "/abs"))


def test_a_ref_resolves_to_its_commit_and_a_clean_snapshot(toy, tmp_path: Path) -> None:
    repo, shas = toy
    (repo / "toypkg" / "__init__.py").write_text("dirty\n")  # the working tree must not leak into REF's build
    try:
        got = sources.resolve(sources.parse_source("toypkg", f"{repo}@v0.2.0"), tmp_path)
    finally:
        git(repo, "checkout", "--", ".")
    assert (got.commit, got.dirty, got.ref) == (shas["c5"], None, "v0.2.0")
    snap = Path(got.snapshot)
    assert (snap / "toypkg" / "__init__.py").read_text() == FIXED
    assert not (snap / ".git").exists()
    assert got.requirement == f"toypkg @ {snap.as_uri()}"
    assert got.to_record() == {
        "url": str(repo),
        "ref": "v0.2.0",
        "commit": shas["c5"],
        "dirty": None,
        "release": "0.2.0",
    }


def test_release_base_is_the_newest_release_tag_that_is_an_ancestor(toy) -> None:
    repo, shas = toy
    # c4 is after v0.1.0 on main; v0.1.1/v0.1.2 are on the release branch, not ancestors of c4
    assert sources.release_base(repo, shas["c4"]) == "0.1.0"
    assert sources.release_base(repo, shas["c5"]) == "0.2.0"
    # v0.1.3rc1 is a pre-release: not a release base
    assert sources.release_base(repo, shas["v0.1.2"]) == "0.1.2"


def test_working_tree_hash_covers_tracked_and_untracked_not_ignored(toy, tmp_path: Path) -> None:
    repo, shas = toy
    pin = sources.parse_source("toypkg", str(repo))
    clean = sources.resolve(pin, tmp_path)
    assert (clean.commit, clean.dirty, clean.ref) == (shas["c5"], None, None)
    try:
        (repo / "notes.log").write_text("ignored\n")
        assert sources.resolve(pin, tmp_path).dirty is None  # an ignored file does not make the tree dirty
        (repo / "toypkg" / "extra.py").write_text("X = 1\n")
        one = sources.resolve(pin, tmp_path)
        assert one.dirty and one.commit == shas["c5"]
        assert (Path(one.snapshot) / "toypkg" / "extra.py").read_text() == "X = 1\n"
        assert not (Path(one.snapshot) / "notes.log").exists()
        (repo / "notes.log").write_text("ignored, changed\n")
        assert sources.resolve(pin, tmp_path).dirty == one.dirty
        (repo / "README").write_text("changed\n")
        two = sources.resolve(pin, tmp_path)
        assert two.dirty not in (None, one.dirty) and two.snapshot != one.snapshot
    finally:
        (repo / "toypkg" / "extra.py").unlink(missing_ok=True)
        (repo / "notes.log").unlink(missing_ok=True)
        git(repo, "checkout", "--", ".")


def test_unknown_ref_and_non_repository(toy, tmp_path: Path) -> None:
    repo, _ = toy
    with pytest.raises(EnvError, match="no commit named 'nope'"):
        sources.resolve(sources.parse_source("toypkg", f"{repo}@nope"), tmp_path)
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(EnvError, match="not a git repository"):
        sources.resolve(sources.parse_source("toypkg", str(plain)), tmp_path / "cache")


def test_rules_judge_a_source_build_as_its_release_and_reports_show_the_commit() -> None:
    src = {"peft": {"commit": "04d41cb0123", "release": "0.17.1", "dirty": None}}
    versions = {"peft": "0.18.0.dev0", "torch": "2.13.0"}
    assert sources.rule_versions(versions, src) == {"peft": "0.17.1", "torch": "2.13.0"}
    assert sources.shown("0.18.0.dev0", src["peft"]) == "0.18.0.dev0 @ 04d41cb"
    assert sources.shown("0.18.0.dev0", {**src["peft"], "dirty": "ab"}) == "0.18.0.dev0 @ 04d41cb+dirty"
    assert sources.shown("2.13.0", None) == "2.13.0"
    assert (sources.pr_number("FIX fsdp_auto_wrap_policy for some models (#2167)"), sources.pr_number("x")) == (
        2167,
        None,
    )


def test_env_sources_drops_a_package_reinstalled_since(tmp_path: Path) -> None:
    got = sources.Resolved("peft", "/p", "main", "a" * 40, None, "0.17.1", "/s")
    sources.write_env_sources(tmp_path, {"peft": got}, {"peft": "0.18.0.dev0"})
    assert sources.env_sources(tmp_path, {"peft": "0.18.0.dev0"})["peft"]["commit"] == "a" * 40
    assert sources.env_sources(tmp_path, {"peft": "0.17.1"}) == {}
    sources.write_env_sources(tmp_path, {}, {})
    assert sources.env_sources(tmp_path) == {}


def _installed(venv: Path) -> str:
    code = "import toypkg, pathlib; print(pathlib.Path(toypkg.__file__).read_text())"
    return subprocess.run(
        [str(venv / "bin" / "python"), "-c", code],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def test_env_stamp_keys_on_commit_and_dirty_hash(toy, tmp_path: Path) -> None:
    """Through uv for real: unchanged -> reuse; moved branch -> reinstall; changed dirty tree -> reinstall."""
    repo, shas = toy
    venv = tmp_path / "venv"
    subprocess.run(["uv", "venv", "--quiet", str(venv)], check=True, timeout=120)
    cache = tmp_path / "src"
    git(repo, "branch", "-f", "feature", shas["c2"])

    def prepare(text: str) -> envs.EnvReport:
        src = sources.resolve(sources.parse_source("toypkg", text), cache)
        report = envs.prepare(venv, {}, sources={"toypkg": src}, imports=("toypkg",), label="toy")
        assert report.ok, report.message
        return report

    first = prepare(f"{repo}@feature")
    assert not first.reused and first.versions["toypkg"] == "0.2.0.dev0" and "toy bug" in _installed(venv)
    assert sources.env_sources(venv)["toypkg"]["commit"] == shas["c2"]
    assert prepare(f"{repo}@feature").reused
    git(repo, "branch", "-f", "feature", shas["c4"])  # the branch moved
    moved = prepare(f"{repo}@feature")
    assert not moved.reused and "return 42" in _installed(venv)
    assert sources.env_sources(venv)["toypkg"]["commit"] == shas["c4"]
    # a bare path: the working tree as it is, dirty or not
    assert not prepare(str(repo)).reused
    assert prepare(str(repo)).reused
    try:
        (repo / "toypkg" / "__init__.py").write_text("def behave():\n    return 'dirty'\n")
        dirty = prepare(str(repo))
        assert not dirty.reused and "'dirty'" in _installed(venv)
        assert sources.env_sources(venv)["toypkg"]["dirty"]
        assert prepare(str(repo)).reused
    finally:
        git(repo, "checkout", "--", ".")


def test_a_pin_that_cannot_be_built_is_one_line_naming_the_ref_and_the_last_error(toy, tmp_path: Path) -> None:
    repo, shas = toy  # c3's pyproject.toml does not parse
    venv = tmp_path / "venv"
    subprocess.run(["uv", "venv", "--quiet", str(venv)], check=True, timeout=120)
    got = sources.resolve_pins([f"toypkg={repo}@{shas['c3']}"], tmp_path / "src")
    report = envs.prepare(venv, {}, sources=got, imports=("toypkg",), label="toy")
    assert not report.ok
    line = sources.failure_line(got, report.message)
    print(line)
    assert line.startswith(f"toypkg {repo}@{shas['c3']} ({shas['c3'][:7]}): ") and "\n" not in line
    assert line.endswith("unclosed table, expected `]`")  # the TOML parser's error on c3's pyproject.toml


def test_a_source_build_is_judged_as_its_release_base_and_the_record_says_so(monkeypatch, tmp_path: Path) -> None:
    from fsdp_matrix.cells import find_cell
    from fsdp_matrix.matrix import load_matrix
    from fsdp_matrix.records import Observed
    from fsdp_matrix.runner import session as session_mod
    from fsdp_matrix.verdicts import make_record

    matrix = load_matrix()
    cell = find_cell(matrix, "no-split-modules/lora-orig0-cls_env_unset-shape_plain-ws2", "cpu", 2)
    versions = {"torch": "2.13.0", "peft": "0.13.3.dev0", "transformers": "4.46.3", "accelerate": "1.1.1"}
    main_after_013 = {"peft": {"url": "/c", "ref": "main", "commit": "7717550a08", "dirty": None, "release": "0.13.0"}}
    monkeypatch.setattr(session_mod, "installed_sources", lambda versions: main_after_013)
    run = session_mod.Session(matrix, None, tmp_path, versions)  # type: ignore[arg-type]
    expected = run.expected(cell)
    assert expected.kind == "error"  # 0.13.3.dev0 matches no rule; as 0.13.0 it matches the no-split-modules error rule
    rec = make_record(cell, expected, Observed(status="ok"), versions, 1.0, "old", "r", run.sources)
    assert rec.verdict == "UNEXPECTED-FIX" and rec.versions["peft"] == "0.13.3.dev0"
    assert rec.sources == main_after_013 and rec.schema == SCHEMA
    assert rec.line.endswith("[changed on main, not released yet (peft 7717550 judged as 0.13.0)]")
    released = {"peft": {**main_after_013["peft"], "release": "0.14.0"}}
    monkeypatch.setattr(session_mod, "installed_sources", lambda versions: released)
    assert session_mod.Session(matrix, None, tmp_path, versions).expected(cell).kind == "ok"  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "url, shown",
    [
        ("http://user:s3cr3t@127.0.0.1:8765/peft.git", "http://***@127.0.0.1:8765/peft.git"),
        ("https://s3cr3t@github.com/huggingface/peft", "https://***@github.com/huggingface/peft"),
        ("git+https://u:p%40ss@host/x.git", "git+https://***@host/x.git"),
        ("ssh://git@github.com/huggingface/peft", "ssh://git@github.com/huggingface/peft"),
        ("ssh://git:s3cr3t@github.com/huggingface/peft", "ssh://***@github.com/huggingface/peft"),
        ("https://github.com/huggingface/peft", "https://github.com/huggingface/peft"),
        ("/home/me/peft@main", "/home/me/peft@main"),
    ],
)
def test_credentials_in_a_url_are_redacted(url: str, shown: str) -> None:
    assert sources.redact_url(url) == shown


def test_a_token_in_a_pin_url_reaches_git_and_no_artifact(toy, tmp_path: Path) -> None:
    """``--pin 'peft=git+http://user:TOKEN@host/peft.git@ref'`` wrote the token into the env's sources file, the
    records and report (from that file), the nox log line and the source cache's git config."""
    repo, shas = toy
    token = "s3cr3tTOKEN"
    cache = tmp_path / "cache"
    with auth_git_server(repo, "user", token) as (url, seen):
        text = "toypkg=git+" + url.replace("http://", f"http://user:{token}@") + "@v0.1.0"
        got = sources.resolve_pins([text], cache)["toypkg"]
        again = sources.resolve_pins([text], cache)["toypkg"]  # the mirror is fetched again, with the credentials
    assert got.commit == again.commit == shas["c0"]
    assert any(h.startswith("Basic ") for h in seen)  # the credentials did reach the server
    assert got.url == url.replace("http://", "http://***@")
    shown = [json.dumps(got.to_record()), sources.overlay_line({"toypkg": "0.1.0"}, {"toypkg": got})]
    shown.append(sources.failure_line({"toypkg": got}, "install failed: x"))
    assert not [line for line in shown if token in line]
    venv = tmp_path / "venv"
    venv.mkdir()
    sources.write_env_sources(venv, {"toypkg": got}, {"toypkg": "0.1.0"})
    assert files_holding(tmp_path, token.encode()) == []


def test_an_env_sources_file_of_an_earlier_version_is_read_redacted(tmp_path: Path) -> None:
    entry = {"url": "https://u:s3cr3t@h/p.git", "ref": "main", "commit": "a" * 40, "version": "1.0"}
    (tmp_path / sources.SOURCES_FILE).write_text(json.dumps({"peft": entry}))
    assert sources.env_sources(tmp_path)["peft"]["url"] == "https://***@h/p.git"


def test_a_reused_env_records_the_pin_of_this_run(toy, tmp_path: Path) -> None:
    """A reused env kept the url and ref of the pin that built it in every later record."""
    repo, shas = toy
    venv = tmp_path / "venv"
    subprocess.run(["uv", "venv", "--quiet", str(venv)], check=True, timeout=120)

    def prepare(text: str) -> envs.EnvReport:
        src = sources.resolve(sources.parse_source("toypkg", text), tmp_path / "src")
        report = envs.prepare(venv, {}, sources={"toypkg": src}, imports=("toypkg",), label="toy")
        assert report.ok, report.message
        return report

    assert not prepare(f"{repo}@v0.2.0").reused
    assert prepare(f"{repo}@{shas['c5']}").reused  # the same commit: the env is reused
    assert sources.env_sources(venv)["toypkg"]["ref"] == shas["c5"]


def test_refs_with_a_slash_and_paths_with_an_at_sign(toy, tmp_path: Path) -> None:
    """``PATH@fix/slash-branch`` was read as a path that does not exist: only a SHA of such a branch could be pinned."""
    repo, shas = toy
    git(repo, "branch", "-f", "fix/slash-branch", shas["c2"])
    for text in (f"{repo}@fix/slash-branch", f"git+file://{repo}@fix/slash-branch"):
        pin = sources.parse_source("toypkg", text)
        assert (pin.repo, pin.ref) == (str(repo), "fix/slash-branch"), text
    assert sources.resolve(pin, tmp_path).commit == shas["c2"]
    for text, repo_url, ref in (
        ("git+https://host/peft.git@refs/pull/7/head", "https://host/peft.git", "refs/pull/7/head"),
        ("git+https://u:t@host/peft.git", "https://u:t@host/peft.git", None),
        ("git+ssh://git@host/peft@feature/x", "ssh://git@host/peft", "feature/x"),
    ):
        pin = sources.parse_source("peft", text)
        assert (pin.repo, pin.ref) == (repo_url, ref), text
    odd = tmp_path / "we@ird"
    odd.mkdir()
    assert (sources.parse_source("peft", str(odd)).repo, sources.parse_source("peft", str(odd)).ref) == (str(odd), None)
    pin = sources.parse_source("peft", f"{odd}@main")
    assert (pin.repo, pin.ref) == (str(odd), "main")


def test_a_folder_inside_a_repository_is_not_a_source(toy, tmp_path: Path) -> None:
    """``--pin peft=<checkout>/repros`` was built as the enclosing repository's HEAD + dirty hash from the folder's
    files, then failed as 'not a Python project'."""
    repo, _ = toy
    with pytest.raises(EnvError, match="not the top of a git repository") as info:
        sources.resolve(sources.parse_source("toypkg", str(repo / "toypkg")), tmp_path)
    assert "\n" not in str(info.value)
