"""With nothing configured that yields a CPU torch, a `cpu` combo's torch comes from PyTorch's CPU index.

Real uv installs against two loopback indexes: a stand-in for PyPI whose torch pulls an nvidia library (as the CUDA
build does), and a stand-in for https://download.pytorch.org/whl/cpu serving ``torch 2.13.0+cpu``
(FSDP_MATRIX_TORCH_CPU_INDEX points at it). Tiny wheels, nothing imports torch.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.tags import Tag

from fsdp_matrix.envs import cputorch, installer
from fsdp_matrix.envs.check import installed_versions
from fsdp_matrix.envs.simple import DistFile
from fsdp_matrix.errors import EnvError
from tests.envs.support import make_venv, make_wheel, wheel_index

CUBLAS = "nvidia-cublas-cu12"


@pytest.fixture
def indexes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    pypi, cpu = tmp_path / "pypi", tmp_path / "cpu"
    make_wheel(pypi, "torch", "2.13.0", requires=[f"{CUBLAS}==12.4.5.8"])
    make_wheel(pypi, CUBLAS, "12.4.5.8")
    make_wheel(cpu, "torch", "2.13.0+cpu")
    for var in ("UV_INDEX", "UV_INDEX_URL", "UV_EXTRA_INDEX_URL", "UV_FIND_LINKS", "UV_TORCH_BACKEND", "UV_NO_INDEX"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    with wheel_index(pypi) as pypi_index, wheel_index(cpu, root="whl/cpu") as cpu_index:
        # PyPI itself, which serves only the CUDA build of torch on Linux: not something the user configured
        monkeypatch.setenv("UV_DEFAULT_INDEX", pypi_index.url)
        monkeypatch.setattr(cputorch, "PYPI", pypi_index.url.rstrip("/"))
        monkeypatch.setenv("FSDP_MATRIX_TORCH_CPU_INDEX", cpu_index.url)
        yield pypi_index, cpu_index


@pytest.mark.timeout(300)
def test_cpu_combo_gets_torch_from_the_cpu_index_when_nothing_else_gives_one(indexes, tmp_path, capsys):
    _, cpu_index = indexes
    venv = make_venv(tmp_path / "venv")
    result = installer.install(venv / "bin" / "python", ["torch==2.13.0"], device="cpu", label="old")
    out = capsys.readouterr().out
    assert result.ok, result.output
    got = installed_versions(venv / "bin" / "python", ["torch", CUBLAS])
    assert got == {"torch": "2.13.0+cpu", CUBLAS: None}
    said = [line for line in out.splitlines() if cpu_index.url in line]
    assert len(said) == 1 and "[env old]" in said[0] and "FSDP_MATRIX_TORCH_CPU_INDEX" in said[0], out


@pytest.mark.timeout(300)
def test_refusal_stays_when_the_cpu_index_cannot_be_reached(indexes, tmp_path, monkeypatch):
    monkeypatch.setenv("FSDP_MATRIX_TORCH_CPU_INDEX", "http://127.0.0.1:9/whl/cpu")
    venv = make_venv(tmp_path / "venv")
    result = installer.install(venv / "bin" / "python", ["torch==2.13.0"], device="cpu", label="old")
    assert not result.ok and "refusing to download a CUDA build of torch" in result.output
    assert "127.0.0.1:9/whl/cpu" in result.output, result.output
    assert installed_versions(venv / "bin" / "python", ["torch"]) == {"torch": None}


@pytest.mark.timeout(300)
def test_a_configured_mirror_that_serves_only_the_cuda_build_wins_and_is_refused(indexes, tmp_path, monkeypatch):
    pypi_index, cpu_index = indexes
    # the user's own mirror of PyPI: it serves torch (the CUDA build), so the user has chosen where torch comes from
    monkeypatch.setattr(cputorch, "PYPI", "https://pypi.org/simple")
    venv = make_venv(tmp_path / "venv")
    result = installer.install(venv / "bin" / "python", ["torch==2.13.0"], device="cpu", label="old")
    assert not result.ok and "refusing to download a CUDA build of torch" in result.output
    assert "Your configuration serves torch" in result.output and pypi_index.url.rstrip("/") in result.output
    assert cpu_index.requests == [], "the CPU index was asked although the user's configuration serves torch"


@pytest.mark.timeout(300)
def test_the_users_own_cpu_torch_wins(indexes, tmp_path, monkeypatch):
    _, cpu_index = indexes
    links = tmp_path / "links"
    make_wheel(links, "torch", "2.13.0+cpu")
    monkeypatch.setenv("UV_FIND_LINKS", str(links))
    monkeypatch.setenv("UV_INDEX_STRATEGY", "unsafe-best-match")
    venv = make_venv(tmp_path / "venv")
    result = installer.install(venv / "bin" / "python", ["torch==2.13.0"], device="cpu", label="old")
    assert result.ok, result.output
    assert installed_versions(venv / "bin" / "python", ["torch"]) == {"torch": "2.13.0+cpu"}
    assert cpu_index.requests == [], "the CPU index was asked although the user's configuration gave a CPU torch"


def test_the_cpu_index_is_a_setting_and_uvs_torch_backend_wins():
    assert cputorch.cpu_index({}) == "https://download.pytorch.org/whl/cpu"
    assert cputorch.cpu_index({"FSDP_MATRIX_TORCH_CPU_INDEX": "https://mirror/whl/cpu"}) == "https://mirror/whl/cpu"
    assert cputorch.cpu_index({"FSDP_MATRIX_TORCH_CPU_INDEX": ""}) is None
    assert cputorch.cpu_index({"UV_TORCH_BACKEND": "cu126"}) is None


def test_the_plain_cpu_wheel_for_this_python_is_picked(monkeypatch):
    names = [
        "torch-2.13.0+cpu.cxx11.abi-cp311-cp311-linux_x86_64.whl",
        "torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl",
        "torch-2.13.0+cpu-cp312-cp312-linux_x86_64.whl",
        "torch-2.12.0+cpu-cp311-cp311-linux_x86_64.whl",
    ]
    files = [DistFile(n, url=f"https://i/whl/cpu/{n.replace('+', '%2B')}") for n in names]
    monkeypatch.setattr(cputorch, "project_files", lambda *a, **k: files)
    tag = lambda py: [Tag(f"cp{py[0]}{py[1]}", f"cp{py[0]}{py[1]}", "linux_x86_64")]  # noqa: E731
    monkeypatch.setattr(cputorch, "cpython_tags", tag)
    monkeypatch.setattr(cputorch, "compatible_tags", lambda py: [])
    url = cputorch.cpu_wheel_url("https://i/whl/cpu", "2.13.0", (3, 11))
    assert url.endswith("/torch-2.13.0%2Bcpu-cp311-cp311-linux_x86_64.whl")
    with pytest.raises(EnvError, match="no build of torch 2.14.0 for Python 3.11"):
        cputorch.cpu_wheel_url("https://i/whl/cpu", "2.14.0", (3, 11))
    assert cputorch.torch_pin(["peft==0.21.2", "torch==2.13.0"]) == (1, "2.13.0")
    assert cputorch.torch_pin(["torch>=2"]) is None
