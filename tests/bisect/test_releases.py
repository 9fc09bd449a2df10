"""Candidate releases from configured indexes, offline: file:// indexes, find-links folders, JSON pages."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from packaging.tags import Tag
from packaging.version import Version

from fsdp_matrix.bisect.releases import (
    candidates_between,
    release_candidates,
    releases,
)
from fsdp_matrix.envs.config import PYPI, Locations, configured_locations
from fsdp_matrix.envs.simple import DistFile, list_files, parse_simple
from fsdp_matrix.errors import EnvError

TAGS = [Tag("py3", "none", "any"), Tag("cp311", "cp311", "manylinux_2_28_x86_64")]

HTML = """<!DOCTYPE html><html><body>
<a href="../../files/peft-0.13.2-py3-none-any.whl#sha256=aa">peft-0.13.2-py3-none-any.whl</a>
<a href="../../files/peft-0.14.0-py3-none-any.whl#sha256=bb" data-requires-python="&gt;=3.9">peft-0.14.0-py3-none-any.whl</a>
<a href="../../files/peft-0.14.1-py3-none-any.whl" data-yanked="broken">peft-0.14.1-py3-none-any.whl</a>
<a href="../../files/peft-0.15.0rc1-py3-none-any.whl">peft-0.15.0rc1-py3-none-any.whl</a>
<a href="../../files/peft-0.15.0.tar.gz">peft-0.15.0.tar.gz</a>
<a href="../../files/peft-0.15.1-py3-none-any.whl" data-requires-python="&gt;=3.12">peft-0.15.1-py3-none-any.whl</a>
<a href="../../files/peft-0.15.2-cp312-cp312-win_amd64.whl">peft-0.15.2-cp312-cp312-win_amd64.whl</a>
<a href="../../files/peft-0.15.2-py3-none-any.whl">peft-0.15.2-py3-none-any.whl</a>
<a href="../../files/peftx-0.16.0-py3-none-any.whl">peftx-0.16.0-py3-none-any.whl</a>
</body></html>"""


def avail(files):
    return releases("peft", files, python="3.11.7", tags=TAGS)


def test_html_page_filters_like_an_installer() -> None:
    got = avail(parse_simple(HTML, "text/html"))
    # 0.14.1 yanked, 0.15.1 needs Python 3.12, peftx is another project
    assert sorted(str(v) for v in got) == ["0.13.2", "0.14.0", "0.15.0", "0.15.0rc1", "0.15.2"]
    assert [f.filename for f in got[Version("0.15.2")].files] == ["peft-0.15.2-py3-none-any.whl"]


def test_json_page_gives_yanked_and_upload_times() -> None:
    body = json.dumps(
        {
            "files": [
                {"filename": "peft-0.13.2-py3-none-any.whl", "yanked": False, "upload-time": "2024-10-11T10:00:00.1Z"},
                {
                    "filename": "peft-0.14.0-py3-none-any.whl",
                    "yanked": "bad metadata",
                    "upload-time": "2024-12-06T10:00:00Z",
                },
            ]
        }
    )
    files = parse_simple(body, "application/vnd.pypi.simple.v1+json")
    assert files[1].yanked and not files[0].yanked
    got = avail(files)
    assert list(got) == [Version("0.13.2")]
    assert got[Version("0.13.2")].upload_time.isoformat().startswith("2024-10-11T10:00:00")


def test_between_is_inclusive_and_leaves_out_pre_releases() -> None:
    got = avail(parse_simple(HTML, "text/html"))
    assert candidates_between("peft", "0.13.2", "0.15.2", got) == ["0.13.2", "0.14.0", "0.15.0", "0.15.2"]
    assert candidates_between("peft", "0.13.2", "0.15.2", got, pre=True) == [
        "0.13.2",
        "0.14.0",
        "0.15.0rc1",
        "0.15.0",
        "0.15.2",
    ]
    assert candidates_between("peft", "0.14.0", "0.14.0", got) == ["0.14.0"]


def test_unknown_or_yanked_end_is_an_error() -> None:
    got = avail(parse_simple(HTML, "text/html"))
    with pytest.raises(EnvError, match="peft 0.14.1 is not an installable release"):
        candidates_between("peft", "0.13.2", "0.14.1", got)
    with pytest.raises(EnvError, match="newer than"):
        candidates_between("peft", "0.15.2", "0.13.2", got)


def test_local_label_counts_as_its_release() -> None:
    files = [
        DistFile("torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"),
        DistFile("torch-2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl"),
        DistFile("torch-2.12.0-cp311-cp311-manylinux_2_28_x86_64.whl"),
    ]
    got = releases("torch", files, python="3.11.7", tags=TAGS)
    assert sorted(map(str, got)) == ["2.12.0", "2.13.0"] and len(got[Version("2.13.0")].files) == 2
    assert candidates_between("torch", "2.12.0", "2.13.0+cpu", got) == ["2.12.0", "2.13.0"]


def test_reads_file_indexes_and_find_links_folders(tmp_path: Path) -> None:
    (tmp_path / "simple" / "peft").mkdir(parents=True)
    (tmp_path / "simple" / "peft" / "index.html").write_text(HTML)
    links = tmp_path / "wheels"
    links.mkdir()
    (links / "peft-0.16.0-py3-none-any.whl").write_bytes(b"")
    (links / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"")
    loc = Locations((f"file://{tmp_path}/simple", f"file://{tmp_path}/missing"), (str(links),))
    files = list_files("PEFT", loc)
    assert "peft-0.16.0-py3-none-any.whl" in [f.filename for f in files]
    got = releases("peft", files, python="3.11.7", tags=TAGS)
    assert Version("0.16.0") in got and Version("0.13.2") in got
    found = release_candidates("peft", "0.15.0", "0.16.0", locations=loc)
    assert found[0] == "0.15.0" and found[-1] == "0.16.0" and "0.15.2" in found


def test_unreachable_everywhere_is_an_env_error() -> None:
    with pytest.raises(EnvError, match="cannot list releases of peft"):
        list_files("peft", Locations(("http://127.0.0.1:9/simple",)), timeout=5)


def test_pip_configuration_becomes_the_locations() -> None:
    pip = {"find-links": "/opt/wheels", "extra-index-url": "file:///a/simple file:///b/simple", "cert": "/etc/ca.crt"}
    loc = configured_locations(environ={}, pip=pip)
    assert loc.indexes == (PYPI, "file:///a/simple", "file:///b/simple")
    assert loc.find_links == ("/opt/wheels",) and loc.cafile == "/etc/ca.crt"
    assert configured_locations(environ={}, pip={"index-url": "https://mirror/simple"}).indexes == (
        "https://mirror/simple",
    )


def test_users_own_uv_configuration_wins() -> None:
    environ = {
        "UV_DEFAULT_INDEX": "https://corp/simple",
        "UV_INDEX": "torch=https://download/cpu",
        "UV_FIND_LINKS": "/w1,/w2",
    }
    loc = configured_locations(environ=environ, pip={"find-links": "/opt/wheels"})
    assert loc.indexes == ("https://corp/simple", "https://download/cpu")
    assert loc.find_links == ("/w1", "/w2")
