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
