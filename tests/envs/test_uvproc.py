"""uv bounded: per-request settings, an overall deadline, and its whole process group killed on it."""

import time

import pytest

from fsdp_matrix import envs
from fsdp_matrix.envs import uvproc
from fsdp_matrix.errors import EnvError
from tests.envs.support import make_venv, stalled_index, uv_children


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
