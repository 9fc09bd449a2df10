"""Preparing a pinned env: stamps, reuse, interrupted installs redone, bounded installs (tiny real wheels)."""

import subprocess
import time
from pathlib import Path

import pytest

from fsdp_matrix import envs
from fsdp_matrix.envs import build
from tests.envs.support import PROBE, make_venv, make_wheel, stalled_index, uv_children

A = {PROBE: "1.0"}
B = {PROBE: "2.0"}


def test_stamp_round_trip(tmp_path):
    reqs = ["torch==2.13.0", "peft==0.21.2"]
    assert not envs.is_current(tmp_path, reqs)
    envs.write_stamp(tmp_path, reqs, {"torch": "2.13.0+cpu"})
    assert envs.is_current(tmp_path, list(reversed(reqs)))
    assert not envs.is_current(tmp_path, reqs + ["numpy<2"])


@pytest.fixture
def local_wheels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """uv sees only a find-links folder holding fsdpmx-probe 1.0 and 2.0; nothing here imports torch."""
    wheels = tmp_path / "wheels"
    make_wheel(wheels, PROBE, "1.0")
    make_wheel(wheels, PROBE, "2.0")
    for var in ("UV_INDEX", "UV_INDEX_URL", "UV_DEFAULT_INDEX", "UV_EXTRA_INDEX_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("UV_FIND_LINKS", str(wheels))
    monkeypatch.setenv("UV_NO_INDEX", "1")
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    # the probe package is all there is to import: the torch/peft import check is not what these tests are about
    monkeypatch.setattr(build, "import_check", lambda python, *a, **k: None)
    return wheels


def probe_version(venv: Path) -> str:
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import fsdpmx_probe; print(fsdpmx_probe.VERSION)"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return out.stdout.strip()


def test_interrupted_install_is_redone_when_the_pins_come_back(local_wheels, tmp_path, monkeypatch):
    # Env stamped for A; an install of B is cut off after uv changed the env; the pins go back to A
    venv = make_venv(tmp_path / "venv")
    first = envs.prepare(venv, A)
    assert first.ok, first.message
    real_install = build.install

    def killed_half_way(*args, **kwargs):
        real_install(*args, **kwargs)  # uv replaced 1.0 by 2.0 ...
        raise KeyboardInterrupt  # ... and the harness died before it could record anything

    monkeypatch.setattr(build, "install", killed_half_way)
    with pytest.raises(KeyboardInterrupt):
        envs.prepare(venv, B)
    monkeypatch.setattr(build, "install", real_install)
    for _ in range(2):  # and not only once: the stale stamp used to fail every later run
        again = envs.prepare(venv, A)
        assert again.ok, again.message
        assert not again.reused or again.versions[PROBE] == "1.0"
    assert again.versions[PROBE] == "1.0" and probe_version(venv) == "1.0"


def test_reused_env_that_no_longer_matches_its_pins_is_reinstalled(local_wheels, tmp_path):
    venv = make_venv(tmp_path / "venv")
    assert envs.prepare(venv, A).ok
    subprocess.run(
        ["uv", "pip", "install", "--quiet", "--python", str(venv / "bin" / "python"), f"{PROBE}==2.0"],
        check=True,
        timeout=120,
    )
    report = envs.prepare(venv, A)
    assert report.ok, report.message
    assert report.versions[PROBE] == "1.0" and probe_version(venv) == "1.0"


def test_distribution_with_missing_files_is_rewritten(local_wheels, tmp_path):
    # what a kill during uv's file copy leaves: the metadata says installed, a module file is gone
    venv = make_venv(tmp_path / "venv")
    assert envs.prepare(venv, A).ok
    (next(venv.glob("lib/python*/site-packages/fsdpmx_probe")) / "__init__.py").unlink()
    report = envs.prepare(venv, A)
    assert report.ok and not report.reused, report.message
    assert probe_version(venv) == "1.0"


@pytest.fixture
def stalled(monkeypatch):
    with stalled_index() as server:
        for var in ("UV_FIND_LINKS", "UV_EXTRA_INDEX_URL", "UV_INDEX", "UV_DEFAULT_INDEX", "UV_HTTP_TIMEOUT"):
            monkeypatch.delenv(var, raising=False)
        monkeypatch.delenv("UV_HTTP_RETRIES", raising=False)
        monkeypatch.setenv("UV_INDEX_URL", server.url)
        monkeypatch.setenv("UV_NO_CACHE", "1")
        yield server


@pytest.mark.timeout(120)
def test_stalled_index_fails_fast_with_a_clear_env_error(stalled, tmp_path, monkeypatch):
    # With uv's defaults one stalled request held the install for 131 s (30 s x 4 tries), unexplained
    monkeypatch.setenv("FSDP_MATRIX_HTTP_TIMEOUT", "2")
    venv = make_venv(tmp_path / "venv")
    start = time.monotonic()
    report = envs.prepare(venv, {"six": "1.16.0"})
    took = time.monotonic() - start
    print(f"stalled index: env-error after {took:.1f}s: {report.message.splitlines()[0]}")
    assert not report.ok
    assert "package index did not answer" in report.message and stalled.url in report.message
    assert took < 60
    assert stalled.accepted, "uv never reached the loopback index"
    assert not uv_children()


@pytest.mark.timeout(120)
def test_install_deadline_stops_uv_and_says_so(stalled, tmp_path, monkeypatch):
    # The whole install is bounded too (here 3 s), whatever the per-request timeout is
    monkeypatch.setenv("UV_HTTP_TIMEOUT", "300")
    monkeypatch.setenv("FSDP_MATRIX_INSTALL_TIMEOUT", "3")
    venv = make_venv(tmp_path / "venv")
    start = time.monotonic()
    report = envs.prepare(venv, {"six": "1.16.0"})
    took = time.monotonic() - start
    assert not report.ok and "did not finish within 3s" in report.message, report.message
    assert took < 45
    assert not uv_children()
