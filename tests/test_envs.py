import sys

from fsdp_matrix import envs

PIP = {"find-links": "/opt/wheels", "extra-index-url": "file:///a/simple file:///b/simple"}


def test_pip_config_becomes_uv_environment():
    env = envs.uv_environment({}, PIP)
    assert env["UV_FIND_LINKS"] == "/opt/wheels"
    assert env["UV_EXTRA_INDEX_URL"] == "file:///a/simple file:///b/simple"
    # pip semantics: best version across every index, not the first index that knows the name
    assert env["UV_INDEX_STRATEGY"] == "unsafe-best-match"
    assert env["UV_COMPILE_BYTECODE"] == "1"
    assert (
        envs.uv_environment({}, {"index-url": "https://mirror/simple"})["UV_DEFAULT_INDEX"] == "https://mirror/simple"
    )


def test_users_uv_configuration_wins():
    env = envs.uv_environment({"UV_INDEX": "https://download.pytorch.org/whl/cpu"}, PIP)
    assert "UV_FIND_LINKS" not in env and "UV_EXTRA_INDEX_URL" not in env


def test_pip_config_parses_scopes_and_env_overrides(tmp_path):
    fake = tmp_path / "python"
    fake.write_text(
        "#!/bin/sh\ncat <<'X'\nglobal.find-links='/opt/wheels'\n:env:.find-links='/env/wheels'\n"
        "user.extra-index-url='file:///a/simple'\nX\n"
    )
    fake.chmod(0o755)
    config = envs.pip_config(str(fake))
    assert config == {"find-links": "/env/wheels", "extra-index-url": "file:///a/simple"}


def test_cuda_packages_in_a_dry_run_are_caught():
    out = (
        "Would install 3 packages\n + nvidia-cublas-cu12==12.4.5.8\n + torch==2.13.0\n + triton==3.7.1\n"
        " + peft==0.21.2\n"
    )
    assert envs.cuda_packages(out) == ["nvidia-cublas-cu12", "triton"]
    assert envs.cuda_packages(" + torch==2.13.0+cpu\n + peft==0.21.2\n") == []


def test_version_verification_ignores_build_labels_only():
    installed = {"torch": "2.13.0+cpu", "peft": "0.21.1", "transformers": None}
    assert envs.mismatches(installed, {"torch": "2.13.0"}) == []
    assert envs.mismatches(installed, {"peft": "0.21.2", "transformers": "5.23.0"}) == [
        "peft: pinned 0.21.2, installed 0.21.1",
        "transformers: pinned 5.23.0, installed nothing",
    ]


def test_stamp_round_trip(tmp_path):
    reqs = ["torch==2.13.0", "peft==0.21.2"]
    assert not envs.is_current(tmp_path, reqs)
    envs.write_stamp(tmp_path, reqs, {"torch": "2.13.0+cpu"})
    assert envs.is_current(tmp_path, list(reversed(reqs)))
    assert not envs.is_current(tmp_path, reqs + ["numpy<2"])


def test_installed_versions_of_this_interpreter(tmp_path):
    got = envs.installed_versions(sys.executable, ["pytest", "surely-not-installed-pkg"])
    assert got["pytest"] and got["surely-not-installed-pkg"] is None


# ------------------------------------------------------------------------------------ real installs (tiny wheels)

import subprocess  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import psutil  # noqa: E402
import pytest  # noqa: E402

from fsdp_matrix import downloads, uvproc  # noqa: E402
from fsdp_matrix.errors import EnvError  # noqa: E402
from tests.envs_support import PROBE, make_venv, make_wheel, stalled_index  # noqa: E402

A = {PROBE: "1.0"}
B = {PROBE: "2.0"}


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
    monkeypatch.setattr(envs, "import_check", lambda python, *a, **k: None)
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
    # defect 15: env stamped for A; an install of B is cut off after uv changed the env; the pins go back to A
    venv = make_venv(tmp_path / "venv")
    first = envs.prepare(venv, A)
    assert first.ok, first.message
    real_install = envs.install

    def killed_half_way(*args, **kwargs):
        real_install(*args, **kwargs)  # uv replaced 1.0 by 2.0 ...
        raise KeyboardInterrupt  # ... and the harness died before it could record anything

    monkeypatch.setattr(envs, "install", killed_half_way)
    with pytest.raises(KeyboardInterrupt):
        envs.prepare(venv, B)
    monkeypatch.setattr(envs, "install", real_install)
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


def fake_python(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "bin" / "python"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return path


def test_missing_interpreter_is_an_env_error_not_a_crash(tmp_path):
    # defect 16: FileNotFoundError used to escape installed_versions and import_check
    gone = tmp_path / "gone" / "bin" / "python"
    with pytest.raises(EnvError, match="no interpreter"):
        envs.installed_versions(gone, ["peft"])
    assert "no interpreter" in (envs.import_check(gone) or "")
    # a stamped env whose interpreter was removed: prepare reports it
    venv = tmp_path / "gone"
    venv.mkdir()
    envs.write_stamp(venv, ["peft==0.21.2", "device=cpu"], {"peft": "0.21.2"})
    report = envs.prepare(venv, {"peft": "0.21.2"})
    assert not report.ok and "no interpreter" in report.message


def test_a_hanging_interpreter_is_an_env_error_not_a_crash(tmp_path):
    # defect 16: TimeoutExpired used to escape both probes
    slow = fake_python(tmp_path, "sleep 30")
    start = time.monotonic()
    assert "did not answer within 1s" in (envs.import_check(slow, timeout=1) or "")
    with pytest.raises(EnvError, match="did not answer within 1s"):
        envs.installed_versions(slow, ["peft"], timeout=1)
    assert time.monotonic() - start < 25


@pytest.fixture
def stalled(monkeypatch):
    with stalled_index() as server:
        yield from _stalled_env(server, monkeypatch)


def _stalled_env(server, monkeypatch):
    for var in ("UV_FIND_LINKS", "UV_EXTRA_INDEX_URL", "UV_INDEX", "UV_DEFAULT_INDEX", "UV_HTTP_TIMEOUT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv("UV_HTTP_RETRIES", raising=False)
    monkeypatch.setenv("UV_INDEX_URL", server.url)
    monkeypatch.setenv("UV_NO_CACHE", "1")
    yield server


def uv_children() -> list:
    return [p for p in psutil.Process().children(recursive=True) if p.is_running() and "uv" in p.name()]


@pytest.mark.timeout(120)
def test_stalled_index_fails_fast_with_a_clear_env_error(stalled, tmp_path, monkeypatch):
    # defect 17: with uv's defaults one stalled request held the install for 131 s (30 s x 4 tries), unexplained
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
    # defect 17: the whole install is bounded too (here 3 s), whatever the per-request timeout is
    monkeypatch.setenv("UV_HTTP_TIMEOUT", "300")
    monkeypatch.setenv("FSDP_MATRIX_INSTALL_TIMEOUT", "3")
    venv = make_venv(tmp_path / "venv")
    start = time.monotonic()
    report = envs.prepare(venv, {"six": "1.16.0"})
    took = time.monotonic() - start
    assert not report.ok and "did not finish within 3s" in report.message, report.message
    assert took < 45
    assert not uv_children()


# ------------------------------------------------------------------------------------ CUDA build opt-in + progress


def fake_uv(monkeypatch, dry_output: str, calls: list, delay: float = 0.0):
    def run_uv(args, env, timeout):
        calls.append("dry-run" if "--dry-run" in args else "install")
        time.sleep(delay if "--dry-run" not in args else 0)
        return uvproc.UvRun(0, dry_output, timeout)

    monkeypatch.setattr(envs, "run_uv", run_uv)


CUDA_DRY_RUN = "Would install 3 packages\n + nvidia-cublas-cu12==12.4.5.8\n + torch==2.6.0\n + triton==3.2.0\n"


def test_default_combos_still_refuse_a_cuda_torch(monkeypatch, tmp_path):
    calls: list = []
    fake_uv(monkeypatch, CUDA_DRY_RUN, calls)
    result = envs.install(tmp_path / "bin" / "python", ["torch==2.6.0"], device="cpu")
    assert not result.ok and "refusing to download a CUDA build" in result.output
    assert calls == ["dry-run"]


def test_opted_in_combo_announces_the_download_before_it_starts(monkeypatch, tmp_path, capsys):
    calls: list = []
    fake_uv(monkeypatch, CUDA_DRY_RUN, calls)
    monkeypatch.setattr(
        downloads, "estimate", lambda out, env: calls.append("estimate") or downloads.Estimate(3, 3_100_000_000, 0)
    )
    result = envs.install(
        tmp_path / "bin" / "python", ["torch==2.6.0"], device="cpu", allow_cuda_build=True, label="torch2.6"
    )
    assert result.ok
    assert calls == ["dry-run", "estimate", "install"]
    notice = [line for line in capsys.readouterr().out.splitlines() if "no CPU build" in line]
    assert len(notice) == 1
    assert "[env torch2.6]" in notice[0] and "torch 2.6.0" in notice[0] and "3.1 GB to download" in notice[0]


def test_install_prints_a_heartbeat_while_uv_is_silent(monkeypatch, tmp_path, capsys):
    import functools

    from fsdp_matrix import progress

    calls: list = []
    fake_uv(monkeypatch, " + peft==0.21.2\n", calls, delay=1.5)
    monkeypatch.setattr(envs, "Heartbeat", functools.partial(progress.Heartbeat, interval=0.3))
    assert envs.install(tmp_path / "bin" / "python", ["peft==0.21.2"], label="current").ok
    beats = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[env current] uv installing")]
    assert len(beats) >= 3, beats
    assert all(line.endswith("s)") for line in beats)


def test_uv_gets_bounded_http_settings_unless_the_user_set_them():
    assert envs.uv_environment({}, {})["UV_HTTP_TIMEOUT"] == str(uvproc.HTTP_TIMEOUT)
    assert envs.uv_environment({"FSDP_MATRIX_HTTP_TIMEOUT": "7"}, {})["UV_HTTP_TIMEOUT"] == "7"
    mine = envs.uv_environment({"UV_HTTP_TIMEOUT": "99", "UV_HTTP_RETRIES": "5"}, {})
    assert (mine["UV_HTTP_TIMEOUT"], mine["UV_HTTP_RETRIES"]) == ("99", "5")
    with pytest.raises(EnvError, match="FSDP_MATRIX_INSTALL_TIMEOUT"):
        uvproc.install_timeout({"FSDP_MATRIX_INSTALL_TIMEOUT": "soon"})


def test_uv_is_killed_with_its_group_on_the_deadline(tmp_path):
    # a uv that would run for a minute (waiting on a stalled index) is stopped at 1 s with everything it started
    with stalled_index() as server:
        env = {"UV_INDEX_URL": server.url, "UV_NO_CACHE": "1", "UV_HTTP_TIMEOUT": "60", "UV_FIND_LINKS": ""}
        venv = make_venv(tmp_path / "venv")
        start = time.monotonic()
        run = uvproc.run_uv(["pip", "install", "--python", str(venv / "bin" / "python"), "six"], env, 1)
        assert run.returncode is None and time.monotonic() - start < 20
        assert "did not finish within 1s" in uvproc.failure(run, "the install", env)
    assert not uv_children()
