"""Hypothesis over the arguments of ``bisect``, ``upgrade`` and ``nightly``: a valid argument list
with one malformed change gives one line, a non-zero exit and no traceback. Installs, launches and the package index
are faked: nothing is installed or run, and an example that got past every check would fail the test loudly."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Dict, List

import pytest
from hypothesis import given
from hypothesis import strategies as st
from packaging.version import InvalidVersion, Version

from fsdp_matrix.bisect import cli as bisect_cli
from fsdp_matrix.bisect import nightly, upgrade
from fsdp_matrix.bisect.installers import PinnedInstaller
from fsdp_matrix.bisect.releases import Release, candidates_between
from fsdp_matrix.bisect.runner import LaunchRunner
from fsdp_matrix.report.json import REPORT_SCHEMA
from tests.argfuzz import FUZZ, assert_one_line_error, tokens, tried, words

FIXTURE = str(Path(__file__).parent / "fixtures" / "bisect_matrix.yaml")
CELL = "no-split-modules/shape_plain-ws2"
RELEASES = {"peft": ["0.13.2", "0.14.0", "0.15.0", "0.15.2"], "transformers": ["4.46.3", "4.47.0"]}
COMBOS = ("old", "current", "gpu-newest")
BAD_SECONDS = ["0", "-5", "nan", "inf", "-inf", "1e-400", "abc", "", "1e999"]


def _not_version(text: str) -> bool:
    try:
        Version(text)
    except InvalidVersion:
        return True
    return False


def _not_date(text: str) -> bool:
    try:
        dt.date.fromisoformat(text)
    except ValueError:
        return True
    return False


@pytest.fixture
def paths(tmp_path: Path) -> Dict[str, str]:
    (tmp_path / "afile").write_text("x")
    (tmp_path / "adir").mkdir()
    (tmp_path / "garbage.yaml").write_text("combos: [1, 2\ncases: {")
    named = {"file": "afile", "dir": "adir", "garbage": "garbage.yaml", "cache": "cache", "missing": "missing/m.yaml"}
    return {"tmp": str(tmp_path), **{k: str(tmp_path / v) for k, v in named.items()}}


@pytest.fixture
def faked(monkeypatch: pytest.MonkeyPatch) -> List[str]:
    """Every path past the argument checks ends here, recorded: the property says none may be reached."""
    reached: List[str] = []

    def candidates(package: str, old: str, new: str, pre: bool = False) -> List[str]:
        # the real listing over a fixed index: the same checks and messages, without the network
        available = {Version(v): Release(Version(v)) for v in RELEASES.get(package, [])}
        return candidates_between(package, old, new, available, pre)

    def install(self, pins, extra):
        reached.append(f"install {pins}")
        raise AssertionError("a malformed argument list reached an install")

    monkeypatch.setattr(bisect_cli, "release_candidates", candidates)
    monkeypatch.setattr(upgrade, "release_candidates", candidates)
    monkeypatch.setattr(PinnedInstaller, "install", install)
    monkeypatch.setattr(LaunchRunner, "run_cells", lambda *a: pytest.fail("a malformed argument list reached a run"))
    monkeypatch.setattr(nightly, "check_upgrade", lambda *a: pytest.fail("reached the upgrade check"))
    return reached


def _replace(argv: List[str], option: str, value: str) -> List[str]:
    out = list(argv)
    out[out.index(option) + 1] = value
    return out


def _bisect_cases(paths: Dict[str, str]) -> st.SearchStrategy[List[str]]:
    base = [CELL, "--package", "peft", "--old", "0.13.2", "--new", "0.15.2", "--combo", "old", "--matrix", FIXTURE,
            "--cache", paths["cache"]]  # fmt: skip
    dated = [CELL, "--by-date", "2024-11-20", "2024-12-20", "--matrix", FIXTURE, "--cache", paths["cache"]]
    no_dash = tokens.filter(lambda t: not t.startswith("-"))
    return st.one_of(
        no_dash.filter(lambda t: "shape_" not in t).map(lambda t: [t, *base[1:]]),  # no such cell
        no_dash.filter(_not_version).map(lambda t: _replace(base, "--old", t)),
        no_dash.filter(_not_version).map(lambda t: _replace(base, "--new", t)),
        st.sampled_from(["0.15.2", "0.14.0"]).map(
            lambda old: _replace(_replace(base, "--old", old), "--new", "0.13.2")
        ),
        no_dash.filter(lambda t: t not in RELEASES["peft"] and not _not_version(t)).map(
            lambda t: _replace(base, "--new", t)  # a version the index does not have
        ),
        no_dash.filter(_not_date).map(lambda t: _replace(dated, "--by-date", t)),
        no_dash.filter(_not_date).map(lambda t: dated[:3] + [t] + dated[4:]),
        st.just(dated[:2] + ["2024-12-20", "2024-11-20"] + dated[4:]),  # old after new
        st.one_of(
            tokens.filter(lambda t: "==" not in t),
            st.sampled_from(["peft==0.12.0", "PEFT==0.14.0"]),
            no_dash.map(lambda t: f"transformers=={t}*"),
            st.just("torch==2.13.0 ; extra"),
        ).map(lambda t: base + ["--pin", t]),
        no_dash.filter(lambda t: t not in COMBOS).map(lambda t: _replace(base, "--combo", t)),
        st.sampled_from(["missing", "dir", "garbage", "file"]).map(lambda k: _replace(base, "--matrix", paths[k])),
        st.just(_replace(base, "--cache", paths["file"])),
        st.sampled_from(["dir", "tmp"]).map(lambda k: base + ["--json", paths[k]]),
        st.just(base + ["--json", paths["file"] + "/x.json"]),
        st.sampled_from(["--old", "--new", "--package"]).map(
            lambda o: base[: base.index(o)] + base[base.index(o) + 2 :]
        ),
        words.map(lambda t: base + ["--" + t.replace("=", "") + "-bogus"]),
        st.sampled_from(BAD_SECONDS).map(lambda t: base + ["--timeout", t]),
        no_dash.filter(lambda t: t not in RELEASES).map(lambda t: _replace(base, "--package", t)),
    )


@pytest.mark.timeout(600)
def test_bisect_malformed_arguments_give_one_line(paths, faked) -> None:
    @FUZZ
    @given(argv=_bisect_cases(paths))
    def check(argv: List[str]) -> None:
        assert_one_line_error(["bisect", *argv])

    check()
    tried("bisect")
    assert faked == []


def _upgrade_cases(paths: Dict[str, str]) -> st.SearchStrategy[List[str]]:
    base = ["peft==0.14.0", "--combo", "old", "--matrix", FIXTURE, "--cache", paths["cache"]]
    no_dash = tokens.filter(lambda t: not t.startswith("-"))
    return st.one_of(
        no_dash.filter(lambda t: "==" not in t).map(lambda t: [t, *base[1:]]),
        no_dash.map(lambda t: [f"peft=={t}*", *base[1:]]),
        no_dash.filter(_not_version).map(lambda t: [f"peft=={t}", *base[1:]]),
        st.sampled_from(["numpy==1.0", "peft==0.13.2", "peft==9.9.9", "transformers==4.99.0"]).map(
            lambda t: [t, *base[1:]]
        ),
        st.sampled_from(["peft==0.13.2", "PEFT==0.15.0", "Peft==0.14.0"]).map(lambda t: [base[0], t, *base[1:]]),
        st.lists(no_dash.filter(lambda t: t.strip(", ") and "no-split-modules" not in t), min_size=1, max_size=3).map(
            lambda ts: base + ["--cases", ",".join(ts)]
        ),
        no_dash.filter(lambda t: t not in COMBOS).map(lambda t: _replace(base, "--combo", t)),
        st.sampled_from(["missing", "dir", "garbage", "file"]).map(lambda k: _replace(base, "--matrix", paths[k])),
        st.just(_replace(base, "--cache", paths["file"])),
        st.sampled_from(["dir", "tmp"]).map(lambda k: base + ["--json", paths[k]]),
        st.just(base[1:]),  # no bump at all
        words.map(lambda t: base + ["--" + t.replace("=", "") + "-bogus"]),
        st.sampled_from(BAD_SECONDS).map(lambda t: base + ["--timeout", t]),
    )


@pytest.mark.timeout(600)
def test_upgrade_malformed_arguments_give_one_line(paths, faked) -> None:
    @FUZZ
    @given(argv=_upgrade_cases(paths))
    def check(argv: List[str]) -> None:
        assert_one_line_error(["upgrade", *argv])

    check()
    tried("upgrade")
    assert faked == []


def _night(path: Path) -> str:
    versions = {"torch": "2.15.0", "peft": "0.21.2", "transformers": "5.23.0", "accelerate": "1.15.0",
                "bitsandbytes": "0.50.2"}  # fmt: skip
    entries = {"c/x-ws2": {"verdict": "fix-holds", "line": "", "versions": versions}}
    column = {"id": "n", "number": 1, "label": "n", "versions": versions}
    data = {"schema": REPORT_SCHEMA, "entries": {"n": entries}, "counts": {}, "rows": [], "columns": [column]}
    path.write_text(json.dumps(data))
    return str(path)


@pytest.mark.timeout(600)
def test_nightly_malformed_arguments_give_one_line(paths, faked, tmp_path: Path) -> None:
    good = _night(tmp_path / "night.json")
    (tmp_path / "bad.json").write_text('{"schema": 1}')
    bad = [paths["missing"], paths["dir"], paths["file"], paths["garbage"], str(tmp_path / "bad.json")]
    base = [good, good]
    missing = words.map(lambda t: str(tmp_path / ("m" + t)))
    cases = st.one_of(
        st.tuples(st.sampled_from(bad) | missing, st.booleans()).map(lambda p: [p[0], good] if p[1] else [good, p[0]]),
        st.sampled_from(["--summary", "--json"]).map(lambda o: base + [o, paths["dir"]]),
        st.sampled_from(["--summary", "--json"]).map(lambda o: base + [o, paths["file"] + "/x"]),
        st.just([good]),
        words.map(lambda t: base + ["--" + t.replace("=", "") + "-bogus"]),
    )

    @FUZZ
    @given(argv=cases)
    def check(argv: List[str]) -> None:
        assert_one_line_error(["nightly", *argv])

    check()
    tried("nightly")
