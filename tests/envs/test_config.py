"""The index configuration uv is given: pip's settings translated, the user's own uv settings kept."""

import shutil
import subprocess

import pytest

from fsdp_matrix import envs
from fsdp_matrix.envs.config import PYPI

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


def test_locations_follow_uvs_variables():
    env = {"UV_INDEX_URL": "https://a/simple", "UV_EXTRA_INDEX_URL": "https://b/simple", "UV_INDEX": "cpu=https://c"}
    assert envs.configured_locations(env, {}).indexes == ("https://a/simple", "https://c", "https://b/simple")
    assert envs.configured_locations({}, {}).indexes == (PYPI,)


def test_pip_configuration_becomes_the_locations():
    pip = {"find-links": "/opt/wheels", "extra-index-url": "file:///a/simple file:///b/simple", "cert": "/etc/ca.crt"}
    loc = envs.configured_locations(environ={}, pip=pip)
    assert loc.indexes == (PYPI, "file:///a/simple", "file:///b/simple")
    assert loc.find_links == ("/opt/wheels",) and loc.cafile == "/etc/ca.crt"
    assert envs.configured_locations(environ={}, pip={"index-url": "https://mirror/simple"}).indexes == (
        "https://mirror/simple",
    )


def test_users_own_uv_configuration_wins_for_the_locations_too():
    environ = {
        "UV_DEFAULT_INDEX": "https://corp/simple",
        "UV_INDEX": "torch=https://download/cpu",
        "UV_FIND_LINKS": "/w1,/w2",
    }
    loc = envs.configured_locations(environ=environ, pip={"find-links": "/opt/wheels"})
    assert loc.indexes == ("https://corp/simple", "https://download/cpu")
    assert loc.find_links == ("/w1", "/w2")


# pip prints each value with %r: a multi-line setting (pip's documented form for several URLs) comes out escaped
MULTI_LINE = (
    "global.extra-index-url='\\nhttps://example.invalid/a/simple\\nhttps://example.invalid/b/simple'\n"
    "global.find-links='\\n/w1\\n/w2'\n"
)


def test_multi_line_pip_settings_reach_uv_as_separate_urls(tmp_path):
    # The escaped value reached uv as ONE url with a literal backslash-n, which uv ignored silently
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\ncat <<'X'\n{MULTI_LINE}X\n")
    fake.chmod(0o755)
    pip = envs.pip_config(str(fake))
    env = envs.uv_environment({}, pip)
    assert env["UV_EXTRA_INDEX_URL"] == "https://example.invalid/a/simple https://example.invalid/b/simple"
    assert env["UV_FIND_LINKS"] == "/w1,/w2"
    loc = envs.configured_locations({}, pip)
    assert loc.indexes == (PYPI, "https://example.invalid/a/simple", "https://example.invalid/b/simple")
    assert loc.find_links == ("/w1", "/w2")


def test_multi_line_settings_from_a_real_pip(tmp_path, monkeypatch):
    python = next((p for p in (shutil.which("python3"), shutil.which("python")) if p and _has_pip(p)), None)
    if python is None:
        pytest.skip("no interpreter with pip on PATH to read a pip.conf")
    conf = tmp_path / "pip.conf"
    conf.write_text("[global]\nextra-index-url =\n    file:///a/simple\n    file:///b/simple\n")
    monkeypatch.setenv("PIP_CONFIG_FILE", str(conf))
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
    env = envs.uv_environment({}, envs.pip_config(python))
    assert env["UV_EXTRA_INDEX_URL"] == "file:///a/simple file:///b/simple"


def _has_pip(python: str) -> bool:
    return subprocess.run([python, "-m", "pip", "--version"], capture_output=True, timeout=60).returncode == 0
