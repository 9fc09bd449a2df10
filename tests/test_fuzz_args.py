"""Hypothesis over the arguments of ``run``, ``bench``, ``validate``, ``explain``, ``triage`` and ``export``
(``report``/``diff`` and ``bisect``/``upgrade``/``nightly`` have their own files): a valid argument list with
one malformed change gives one line, a non-zero exit and no traceback. Launches and traced runs are faked: nothing
runs, and an example that got past every check fails the test loudly."""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List

import pytest
from hypothesis import given
from hypothesis import strategies as st
from packaging.version import InvalidVersion, Version

from fsdp_matrix.matrix import PACKAGES
from tests.argfuzz import FUZZ, assert_one_line_error, tokens, tried, words

HERE = Path(__file__).resolve().parent
FAULTS = str(HERE / "runner" / "fault_matrix.yaml")
FAULT_CELL = "healthy/fault_ok-n1-sleep1-ws2"
CELL = "no-split-modules/lora-orig0-cls_env_unset-shape_plain-ws2"
COMBOS = ("old", "current")
BAD_SECONDS = ["0", "-5", "nan", "inf", "-inf", "1e-400", "abc", "", "1e999"]
BAD_COUNTS = ["0", "-1", "1.5", "abc", "", "1e999", "nan", "-99999999999999999999999"]
UNSPLITTABLE = ["'a", '"b', "--nnodes='2", 'x "y']
no_dash = tokens.filter(lambda t: not t.startswith("-"))
bogus_flag = words.map(lambda t: "--" + t.replace("=", "") + "-bogus")


def _not_version(text: str) -> bool:
    try:
        Version(text.strip().lstrip("="))
    except InvalidVersion:
        return True
    return False


def _replace(argv: List[str], option: str, value: str) -> List[str]:
    out = list(argv)
    out[out.index(option) + 1] = value
    return out


@pytest.fixture
def paths(tmp_path: Path) -> Dict[str, str]:
    (tmp_path / "afile").write_text("x")
    (tmp_path / "adir").mkdir()
    (tmp_path / "garbage.yaml").write_text("combos: [1, 2\ncases: {")
    (tmp_path / "error.txt").write_text("Traceback (most recent call last):\nRuntimeError: boom\n")
    named = {"file": "afile", "dir": "adir", "garbage": "garbage.yaml", "missing": "missing/m.yaml"}
    return {
        "tmp": str(tmp_path),
        "error": str(tmp_path / "error.txt"),
        **{k: str(tmp_path / v) for k, v in named.items()},
    }


@pytest.fixture
def faked(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every path past the argument checks ends here: the property says none may be reached."""
    from fsdp_matrix.runner.launcher import Launcher

    monkeypatch.setattr(Launcher, "_start", lambda self: pytest.fail("a malformed argument list reached a launch"))


def _bad_matrix(paths: Dict[str, str]) -> st.SearchStrategy[str]:
    return st.one_of(
        st.sampled_from([paths[k] for k in ("missing", "dir", "garbage", "file")]),
        words.map(lambda t: str(Path(paths["tmp"]) / ("m" + t))),
    )


def _check(command: str, cases: st.SearchStrategy[List[str]]) -> None:
    @FUZZ
    @given(argv=cases)
    def check(argv: List[str]) -> None:
        assert_one_line_error([command, *argv])

    check()
    tried(command)


@pytest.mark.timeout(600)
def test_run_malformed_arguments_give_one_line(paths, faked) -> None:
    base = ["--matrix", FAULTS, "--results", str(Path(paths["tmp"]) / "res"), "--combo", "local", FAULT_CELL]

    def bad_int(text: str) -> bool:
        try:
            return not 1 <= int(text) <= 1024
        except ValueError:
            return True

    _check(
        "run",
        st.one_of(
            no_dash.filter(lambda t: "fault_" not in t).map(lambda t: base[:-1] + [t]),  # no such cell
            st.lists(
                no_dash.filter(lambda t: t.strip(", ") and t.strip() not in ("faults", "healthy")), min_size=1
            ).map(lambda ts: base + ["--cases", ",".join(ts)]),
            st.just(base + ["--cases", "faults"]),  # the cell asked for is not in --cases
            (no_dash.filter(bad_int) | st.sampled_from(["0", "-1", "1025", "1e3"])).map(
                lambda t: base + ["--world-size", t]
            ),
            st.sampled_from(BAD_SECONDS).map(lambda t: base + ["--cell-timeout", t]),
            no_dash.filter(lambda t: t not in ("auto", "cpu", "cuda")).map(lambda t: base + ["--device", t]),
            _bad_matrix(paths).map(lambda m: _replace(base, "--matrix", m)),
            st.sampled_from([paths["file"], paths["file"] + "/sub"]).map(lambda r: _replace(base, "--results", r)),
            st.sampled_from(UNSPLITTABLE).map(lambda t: base + ["--torchrun-args", t]),
            bogus_flag.map(lambda f: base + [f]),
        ),
    )


@pytest.mark.timeout(600)
def test_bench_malformed_arguments_give_one_line(paths, faked) -> None:
    base = ["--matrix", FAULTS, "--cells", "2", "--json", str(Path(paths["tmp"]) / "bench.json")]
    _check(
        "bench",
        st.one_of(
            st.sampled_from(BAD_COUNTS).map(lambda t: _replace(base, "--cells", t)),
            st.sampled_from([paths["dir"], paths["file"] + "/x.json"]).map(lambda j: _replace(base, "--json", j)),
            _bad_matrix(paths).map(lambda m: _replace(base, "--matrix", m)),
            st.sampled_from(BAD_SECONDS).map(lambda t: base + ["--cell-timeout", t]),
            st.sampled_from(UNSPLITTABLE).map(lambda t: base + ["--torchrun-args", t]),
            bogus_flag.map(lambda f: base + [f]),
            no_dash.map(lambda t: base + [t]),  # bench takes no positional argument
        ),
    )


@pytest.mark.timeout(600)
def test_validate_malformed_arguments_give_one_line(paths, tmp_path_factory) -> None:
    def junk_file(text: str) -> str:
        path = tmp_path_factory.mktemp("doc") / "matrix.yaml"
        path.write_text(text, encoding="utf-8", errors="replace")
        return str(path)

    _check(
        "validate",
        st.one_of(
            _bad_matrix(paths).map(lambda m: [m]),
            st.text(max_size=200).map(lambda t: [junk_file(t)]),  # never a valid matrix
            no_dash.map(lambda t: [FAULTS, t]),  # one matrix at a time
            bogus_flag.map(lambda f: [FAULTS, f]),
        ),
    )


def _bad_versions() -> st.SearchStrategy[str]:
    return st.one_of(
        no_dash.filter(lambda t: t.strip(", ") and "=" not in t),
        st.tuples(st.sampled_from(PACKAGES), no_dash.filter(_not_version)).map(lambda p: f"{p[0]}={p[1]}"),
        no_dash.filter(lambda t: t.strip() not in PACKAGES).map(lambda t: f"{t}=1.0"),
    ).filter(lambda t: t.replace(",", "").strip())  # (explain: an empty --versions adds nothing on top)


@pytest.mark.timeout(600)
def test_explain_malformed_arguments_give_one_line(paths) -> None:
    base = [CELL, "--combo", "old"]
    _check(
        "explain",
        st.one_of(
            no_dash.filter(lambda t: "shape_" not in t).map(lambda t: [t, *base[1:]]),
            no_dash.filter(lambda t: t not in COMBOS).map(lambda t: _replace(base, "--combo", t)),
            _bad_versions().map(lambda v: base + ["--versions", v]),
            no_dash.filter(lambda t: t not in ("cpu", "cuda")).map(lambda t: base + ["--device", t]),
            # (an empty results dir is a results dir with no record yet: not malformed)
            st.sampled_from(["missing", "garbage", "file"]).map(lambda k: base + ["--results", paths[k]]),
            _bad_matrix(paths).map(lambda m: base + ["--matrix", m]),
            bogus_flag.map(lambda f: base + [f]),
            st.just(base[1:]),  # no cell
        ),
    )


@pytest.mark.timeout(600)
def test_triage_malformed_arguments_give_one_line(paths) -> None:
    base = [paths["error"], "--versions", "torch=2.4.1,peft=0.13.2"]
    _check(
        "triage",
        st.one_of(
            st.sampled_from(["missing", "dir"]).map(lambda k: [paths[k], *base[1:]]),
            words.map(lambda t: [str(Path(paths["tmp"]) / ("m" + t)), *base[1:]]),
            (_bad_versions() | st.sampled_from(["", " ", ",", "\r"])).map(lambda v: _replace(base, "--versions", v)),
            # (a file of other lines is read as records, and what was skipped is said on stdout: not malformed)
            words.map(lambda t: base + ["--results", str(Path(paths["tmp"]) / ("m" + t))]),
            _bad_matrix(paths).map(lambda m: base + ["--matrix", m]),
            bogus_flag.map(lambda f: base + [f]),
            no_dash.map(lambda t: base + [t]),  # one file at a time
        ),
    )


@pytest.mark.timeout(600)
def test_export_malformed_arguments_give_one_line(paths, faked) -> None:
    out = str(Path(paths["tmp"]) / "out")
    base = [CELL, "--combo", "old", "--out", out, "--trace", "never"]
    _check(
        "export",
        st.one_of(
            no_dash.filter(lambda t: "shape_" not in t).map(lambda t: [t, *base[1:]]),
            no_dash.filter(lambda t: t not in COMBOS).map(lambda t: _replace(base, "--combo", t)),
            st.sampled_from([paths["file"], paths["file"] + "/sub"]).map(lambda o: _replace(base, "--out", o)),
            st.sampled_from([paths["file"] + "/x.py", paths["dir"]]).map(lambda s: base + ["--script", s]),
            no_dash.filter(lambda t: t not in ("auto", "always", "never")).map(lambda t: _replace(base, "--trace", t)),
            st.sampled_from(["garbage", "file"]).map(lambda k: base + ["--results", paths[k]]),
            _bad_matrix(paths).map(lambda m: base + ["--matrix", m]),
            bogus_flag.map(lambda f: base + [f]),
            st.just(base[1:]),  # no cell
        ),
    )
