"""Builders for env tests: tiny real wheels in a find-links folder, real uv venvs, a loopback index that stalls."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import socket
import subprocess
import sys
import threading
import zipfile
from pathlib import Path
from typing import Iterator, List

PROBE = "fsdpmx-probe"
"""A made-up distribution name: it exists only in the test's find-links folder."""


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def make_wheel(folder: Path, name: str, version: str, payload_files: int = 1, payload_kb: int = 1) -> Path:
    """A pure-Python wheel of ``name==version`` whose module reports its version; ``payload_*`` make it bigger."""
    module = name.replace("-", "_")
    files = {f"{module}/__init__.py": f"VERSION = {version!r}\n".encode()}
    for i in range(payload_files):
        files[f"{module}/data_{i}.py"] = (f"# {i}\n" + "x = 1\n" * (payload_kb * 170)).encode()
    info = f"{module}-{version}.dist-info"
    files[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode()
    wheel = "Wheel-Version: 1.0\nGenerator: fsdp-matrix-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    files[f"{info}/WHEEL"] = wheel.encode()
    record = [_record_line(n, d) for n, d in files.items()] + [f"{info}/RECORD,,"]
    files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{module}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for n, d in files.items():
            zf.writestr(n, d)
    return path


def make_venv(path: Path) -> Path:
    subprocess.run(["uv", "venv", "--quiet", "--python", sys.executable, str(path)], check=True, timeout=120)
    return path


class StalledIndex:
    """A loopback server that accepts every connection and never answers: an index that hangs."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.accepted: List[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/simple"

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted.append(conn)

    def close(self) -> None:
        for conn in self.accepted:
            conn.close()
        self.sock.close()


@contextlib.contextmanager
def stalled_index() -> Iterator[StalledIndex]:
    server = StalledIndex()
    try:
        yield server
    finally:
        server.close()


def uv_children() -> list:
    """uv processes this test process started that are still running."""
    import psutil

    return [p for p in psutil.Process().children(recursive=True) if p.is_running() and "uv" in p.name()]
