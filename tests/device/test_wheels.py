"""A site's wheels: its requirements and what they need that neither the image nor a site under it holds."""

from __future__ import annotations

import zipfile

from fsdp_matrix.device import image, wheels
from tests.device.support import Index, fake_wheel


def test_a_site_takes_its_requirements_and_their_missing_needs_only(tmp_path):
    src = tmp_path / "index"
    fake_wheel(src, "trl", "1.14.1", ["datasets>=3", "torch>=2", "accelerate", "rich; extra == 'cli'"])
    fake_wheel(src, "datasets", "5.2.0", ["dill<0.5", "pyarrow", "pydantic; python_version < '3.0'"])
    fake_wheel(src, "dill", "0.4.1")
    fake_wheel(src, "dill", "0.5.0")  # outside datasets' bound: never taken
    site = image.Site("t", ("trl==1.14.1",))
    index = Index(src)
    got = wheels.fetch_site(site, tmp_path / "site", index.download, below={}, say=lambda _: None)
    # torch, accelerate and pyarrow are in the image; rich only for an extra; pydantic's marker is false on 3.12
    assert [p.name for p in got] == [
        "datasets-5.2.0-py3-none-any.whl", "dill-0.4.1-py3-none-any.whl", "trl-1.14.1-py3-none-any.whl",
    ]  # fmt: skip
    assert index.asked == ["trl==1.14.1", "datasets>=3", "dill<0.5"]


def test_a_name_a_site_below_carries_is_not_fetched_again_unless_its_version_does_not_fit(tmp_path):
    src = tmp_path / "index"
    fake_wheel(src, "peft", "0.13.0", ["pydantic"])
    index = Index(src)
    below = {"pydantic": "2.12.5"}
    got = wheels.fetch_site(image.Site("t", ("peft==0.13.0",)), tmp_path / "s", index.download, below, print)
    assert [p.name for p in got] == ["peft-0.13.0-py3-none-any.whl"]
    # datasets 4.4.2 wants dill<0.4.1; the site below carries 0.4.1: this site (in front) carries its own
    fake_wheel(src, "datasets", "4.4.2", ["dill<0.4.1,>=0.3.0"])
    fake_wheel(src, "dill", "0.4.0")
    fake_wheel(src, "dill", "0.4.1")
    site = image.Site("old", ("datasets==4.4.2",))
    got = wheels.fetch_site(site, tmp_path / "old", index.download, {"dill": "0.4.1"}, print)
    assert [p.name for p in got] == ["datasets-4.4.2-py3-none-any.whl", "dill-0.4.0-py3-none-any.whl"]


def test_an_image_package_at_another_version_is_fetched_when_the_site_names_it(tmp_path):
    src = tmp_path / "index"
    fake_wheel(src, "transformers", "4.46.3", ["huggingface-hub<1.0,>=0.23.2", "tokenizers<0.21"])
    fake_wheel(src, "huggingface-hub", "0.36.0")
    site = image.Site("t", ("transformers==4.46.3", "huggingface-hub==0.36.0"))
    index = Index(src)
    got = wheels.fetch_site(site, tmp_path / "s", index.download, {}, lambda _: None)
    # tokenizers is in the image and the site does not name it: the image's stays (a site must name its own)
    assert sorted(p.name.split("-")[0] for p in got) == ["huggingface_hub", "transformers"]


def test_a_wheel_already_there_is_kept_and_a_stale_one_removed(tmp_path):
    src, folder = tmp_path / "index", tmp_path / "s"
    fake_wheel(src, "pydantic", "2.12.5")
    kept = fake_wheel(folder, "pydantic", "2.12.5")
    stale = fake_wheel(folder, "pydantic", "2.11.0")
    index = Index(src)
    lines = []
    got = wheels.fetch_site(image.Site("t", ("pydantic==2.12.5",)), folder, index.download, {}, lines.append)
    assert got == [kept] and not stale.exists() and index.asked == []
    assert "kept" in lines[0]


def test_requires_reads_metadata_with_the_image_markers(tmp_path):
    wheel = fake_wheel(tmp_path, "x", "1", ["a", "b; sys_platform == 'win32'", "c; python_version >= '3.12'"])
    assert [r.name for r in wheels.requires(wheel)] == ["a", "c"]


def test_a_trimmed_wheel_keeps_the_named_libraries_and_a_record_that_matches(tmp_path):
    wheel = fake_wheel(tmp_path, "bitsandbytes", "0.50.2")
    with zipfile.ZipFile(wheel, "a") as zf:
        for lib in ("libbitsandbytes_cpu.so", "libbitsandbytes_cuda128.so", "libbitsandbytes_cuda130.so"):
            zf.writestr(f"bitsandbytes/{lib}", b"\x7fELF" + b"\0" * 4096)
        zf.writestr("bitsandbytes-0.50.2.dist-info/RECORD", "".join(
            f"{n},sha256=x,1\n" for n in ("bitsandbytes/__init__.py", "bitsandbytes/libbitsandbytes_cpu.so",
                                         "bitsandbytes/libbitsandbytes_cuda128.so",
                                         "bitsandbytes/libbitsandbytes_cuda130.so")))  # fmt: skip
    keep = image.TRIM["bitsandbytes"]
    line = wheels.trim(wheel, keep)
    assert line and "keeps libbitsandbytes_cpu.so, libbitsandbytes_cuda130.so" in line
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        record = zf.read("bitsandbytes-0.50.2.dist-info/RECORD").decode()
    assert "bitsandbytes/libbitsandbytes_cuda128.so" not in names | set(record.split())
    assert {"bitsandbytes/libbitsandbytes_cpu.so", "bitsandbytes/libbitsandbytes_cuda130.so"} <= names
    assert "libbitsandbytes_cuda130.so,sha256=x,1" in record and "cuda128" not in record
    assert wheels.trim(wheel, keep) is None  # already trimmed: nothing to do
