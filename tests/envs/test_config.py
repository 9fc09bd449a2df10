"""The index configuration uv is given: pip's settings translated, the user's own uv settings kept."""

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
