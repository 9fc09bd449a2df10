"""The one Simple-API client against loopback indexes: JSON and HTML pages, file:// and folders, auth, a CA file."""

from __future__ import annotations

import base64
import http.server
import json
import shutil
import ssl
import subprocess
import threading
import urllib.error
from pathlib import Path

import pytest

from fsdp_matrix.envs.config import Locations
from fsdp_matrix.envs.simple import fetch, list_files, parse_simple
from fsdp_matrix.errors import EnvError

PAGE = {
    "meta": {"api-version": "1.1"},
    "files": [
        {"filename": "peft-0.13.2-py3-none-any.whl", "size": 320_000, "upload-time": "2024-10-11T10:00:00.123Z"},
        {"filename": "peft-0.14.0-py3-none-any.whl", "yanked": "bad metadata", "requires-python": ">=3.9"},
    ],
}
HTML = (
    '<a href="../../f/peft-0.13.2-py3-none-any.whl#sha256=aa">x</a>\n'
    '<a href="../../f/peft-0.14.0-py3-none-any.whl" data-yanked="" data-requires-python="&gt;=3.9">y</a>\n'
)


def test_json_page_gives_sizes_yanked_and_upload_times() -> None:
    files = parse_simple(json.dumps(PAGE), "application/vnd.pypi.simple.v1+json")
    assert [(f.filename, f.size, f.yanked) for f in files] == [
        ("peft-0.13.2-py3-none-any.whl", 320_000, False),
        ("peft-0.14.0-py3-none-any.whl", None, True),
    ]
    assert files[0].upload_time.isoformat().startswith("2024-10-11T10:00:00") and files[1].requires_python == ">=3.9"


def test_html_page_gives_names_yanked_and_requires_python() -> None:
    files = parse_simple(HTML, "text/html")
    assert [(f.filename, f.yanked, f.requires_python, f.size) for f in files] == [
        ("peft-0.13.2-py3-none-any.whl", False, None, None),
        ("peft-0.14.0-py3-none-any.whl", True, ">=3.9", None),
    ]


def test_file_indexes_and_find_links_folders(tmp_path: Path) -> None:
    (tmp_path / "simple" / "peft").mkdir(parents=True)
    (tmp_path / "simple" / "peft" / "index.html").write_text(HTML)
    links = tmp_path / "wheels"
    links.mkdir()
    (links / "peft-0.16.0-py3-none-any.whl").write_bytes(b"12345")
    loc = Locations((f"file://{tmp_path}/simple", f"file://{tmp_path}/missing"), (str(links),))
    files = {f.filename: f for f in list_files("PEFT", loc)}
    assert sorted(files) == [f"peft-{v}-py3-none-any.whl" for v in ("0.13.2", "0.14.0", "0.16.0")]
    assert files["peft-0.16.0-py3-none-any.whl"].size == 5


def test_unreachable_everywhere_is_an_env_error() -> None:
    with pytest.raises(EnvError, match="cannot list releases of peft"):
        list_files("peft", Locations(("http://127.0.0.1:9/simple",)), timeout=5)


class _Index(http.server.BaseHTTPRequestHandler):
    auth = "Basic " + base64.b64encode(b"me:s3cret/+").decode()

    def do_GET(self):  # noqa: N802 - the stdlib's name
        if self.headers.get("Authorization") != self.auth:
            self.send_response(401)
            self.end_headers()
            return
        if self.path != "/simple/peft/":
            self.send_response(404)
            self.end_headers()
            return
        body = json.dumps(PAGE).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/vnd.pypi.simple.v1+json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def _serve(context: ssl.SSLContext | None = None):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Index)
    if context is not None:
        server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_credentials_in_the_index_url_are_sent_as_basic_auth() -> None:
    server = _serve()
    try:
        port = server.server_address[1]
        files = list_files("peft", Locations((f"http://me:s3cret%2F%2B@127.0.0.1:{port}/simple",)))
        assert [f.size for f in files] == [320_000, None]
        with pytest.raises(EnvError, match="401"):
            list_files("peft", Locations((f"http://127.0.0.1:{port}/simple",)), timeout=5)
    finally:
        server.shutdown()


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make a test certificate")
def test_https_index_is_verified_against_the_configured_ca_file(tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server = _serve(context)
    try:
        url = f"https://me:s3cret%2F%2B@127.0.0.1:{server.server_address[1]}/simple"
        assert len(list_files("peft", Locations((url,), cafile=str(cert)))) == 2
        with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):  # not without the CA file
            fetch(url.replace("me:s3cret%2F%2B@", "") + "/peft/", None, 5)
    finally:
        server.shutdown()
