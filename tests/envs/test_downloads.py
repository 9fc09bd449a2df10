"""Download size of an install: planned packages, uv's cache, and sizes from a loopback PEP 691 index."""

from __future__ import annotations

import http.server
import json
import threading
from pathlib import Path

import pytest

from fsdp_matrix.envs import downloads
from fsdp_matrix.envs.config import Locations

DRY_RUN = (
    "Resolved 3 packages in 1.2s\nWould install 3 packages\n + nvidia-cublas-cu12==12.4.5.8\n + torch==2.6.0\n"
    " + six==1.16.0\n"
)


def test_planned_packages_of_a_dry_run() -> None:
    assert downloads.planned(DRY_RUN) == [("nvidia-cublas-cu12", "12.4.5.8"), ("torch", "2.6.0"), ("six", "1.16.0")]


def test_uv_cache_entries_count_as_cached(tmp_path: Path) -> None:
    entry = tmp_path / "wheels-v8" / "pypi" / "six" / "1.16.0-py2.py3-none-any"
    entry.mkdir(parents=True)
    (tmp_path / "wheels-v8" / "pypi" / "torch").mkdir(parents=True)
    (tmp_path / "wheels-v8" / "pypi" / "torch" / "2.6.0-cp311-cp311-manylinux1_x86_64.lock").touch()
    assert downloads.in_uv_cache(tmp_path, "six", "1.16.0")
    assert not downloads.in_uv_cache(tmp_path, "six", "1.17.0")
    assert not downloads.in_uv_cache(tmp_path, "torch", "2.6.0"), "a lock file is not a cached wheel"
    assert not downloads.in_uv_cache(None, "six", "1.16.0")


@pytest.fixture
def index():
    pages = {
        "/simple/torch/": [
            {"filename": "torch-2.6.0-cp311-cp311-manylinux1_x86_64.whl", "size": 766_000_000},
            {"filename": "torch-2.6.0-cp311-cp311-win_amd64.whl", "size": 1},
            {"filename": "torch-2.5.1-cp311-cp311-manylinux1_x86_64.whl", "size": 2},
        ],
        "/simple/nvidia-cublas-cu12/": [
            {"filename": "nvidia_cublas_cu12-12.4.5.8-py3-none-manylinux2014_x86_64.whl", "size": 363_000_000},
            {"filename": "nvidia_cublas_cu12-12.4.5.8-py3-none-manylinux2014_x86_64.whl", "size": 9, "yanked": True},
        ],
    }

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the stdlib's name
            files = pages.get(self.path)
            if files is None:
                self.send_response(404)
                self.end_headers()
                return
            body = json.dumps({"meta": {"api-version": "1.1"}, "files": files}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/vnd.pypi.simple.v1+json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/simple"
    server.shutdown()


def test_sizes_come_from_the_index_for_this_platform(index) -> None:
    where = Locations((index,))
    assert downloads.wheel_size("torch", "2.6.0", where) == 766_000_000
    assert downloads.wheel_size("nvidia-cublas-cu12", "12.4.5.8", where) == 363_000_000
    assert downloads.wheel_size("six", "1.16.0", where) is None


def test_estimate_leaves_out_what_uv_has_cached(index, tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "wheels-v8" / "pypi" / "nvidia-cublas-cu12" / "12.4.5.8-py3-none-manylinux2014_x86_64").mkdir(
        parents=True
    )
    monkeypatch.setattr(downloads, "uv_cache_dir", lambda env: tmp_path)
    est = downloads.estimate(DRY_RUN, {}, Locations((index,)))
    assert (est.packages, est.cached, est.to_fetch, est.unknown) == (3, 1, 766_000_000, ["six"])
    assert est.describe() == ("at least 766.0 MB to download (2 of 3 packages not in uv's cache; size unknown for six)")


def test_unknown_torch_size_is_never_announced_as_zero() -> None:
    # An HTML-only or file:// index gives no sizes, and the ~3 GB download was announced as "about 0 B"
    est = downloads.Estimate(packages=22, to_fetch=0, cached=0, unknown=["torch", "nvidia-cublas-cu12"])
    text = est.describe()
    assert "0 B" not in text and text.startswith("size unknown"), text
    assert "22 of 22 packages not in uv's cache" in text
    # some sizes known, torch's not: the known part is a lower bound, and it says so
    partial = downloads.Estimate(packages=3, to_fetch=363_000_000, cached=0, unknown=["torch"]).describe()
    assert partial.startswith("at least 363.0 MB") and "size unknown for torch" in partial, partial
