"""Builders for env tests: tiny real wheels in a find-links folder, real uv venvs, a loopback index that stalls."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import http.server
import socket
import subprocess
import sys
import threading
import urllib.parse
import zipfile
from pathlib import Path
from typing import Dict, Iterator, List, Sequence

PROBE = "fsdpmx-probe"
"""A made-up distribution name: it exists only in the test's find-links folder."""


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def make_wheel(
    folder: Path, name: str, version: str, payload_files: int = 1, payload_kb: int = 1, requires: Sequence[str] = ()
) -> Path:
    """A pure-Python wheel of ``name==version`` whose module reports its version; ``payload_*`` make it bigger,
    ``requires`` are its Requires-Dist."""
    module = name.replace("-", "_")
    files = {f"{module}/__init__.py": f"VERSION = {version!r}\n".encode()}
    for i in range(payload_files):
        files[f"{module}/data_{i}.py"] = (f"# {i}\n" + "x = 1\n" * (payload_kb * 170)).encode()
    info = f"{module}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    metadata += "".join(f"Requires-Dist: {r}\n" for r in requires)
    files[f"{info}/METADATA"] = metadata.encode()
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


class WheelIndex:
    """A loopback PEP 503 index (HTML pages) serving the wheels of a folder, at ``http://127.0.0.1:PORT/<root>``."""

    def __init__(self, wheels: Path, root: str = "simple") -> None:
        self.requests: List[str] = []
        by_project: Dict[str, List[Path]] = {}
        for wheel in sorted(wheels.glob("*.whl")):
            by_project.setdefault(wheel.name.split("-", 1)[0].replace("_", "-").lower(), []).append(wheel)
        index = self

        class Handler(http.server.BaseHTTPRequestHandler):
            head = False

            def do_HEAD(self):  # noqa: N802 - the stdlib's name; uv asks before a range request
                self.head = True
                self.do_GET()

            def do_GET(self):  # noqa: N802 - the stdlib's name
                index.requests.append(self.path)
                path = urllib.parse.unquote(self.path)
                project = path.strip("/").split("/")[-1]
                if path.startswith(f"/{root}/") and path.endswith("/") and project in by_project:
                    links = "".join(
                        f'<a href="/files/{urllib.parse.quote(w.name)}">{w.name}</a>\n' for w in by_project[project]
                    )
                    self._send(f"<html><body>\n{links}</body></html>".encode(), "text/html")
                elif path.startswith("/files/") and (wheels / path[7:]).is_file():
                    self._send((wheels / path[7:]).read_bytes(), "application/octet-stream")
                else:
                    self.send_response(404)
                    self.end_headers()

            def _send(self, body: bytes, content_type: str) -> None:
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if not self.head:
                    self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/{root}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@contextlib.contextmanager
def wheel_index(wheels: Path, root: str = "simple") -> Iterator[WheelIndex]:
    index = WheelIndex(wheels, root)
    try:
        yield index
    finally:
        index.close()
