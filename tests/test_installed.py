"""The one installed-versions helper, and where a package was installed from (PEP 610): the ``installed`` combo."""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path
from typing import Optional

import pytest

from fsdp_matrix import installed
from fsdp_matrix.installed import installed_versions


def test_installed_and_missing_packages_in_the_order_given() -> None:
    got = installed_versions(["pydantic", "no-such-package-fsdp-matrix", "packaging"])
    assert list(got) == ["pydantic", "no-such-package-fsdp-matrix", "packaging"]
    assert got["pydantic"] == metadata.version("pydantic")
    assert got["no-such-package-fsdp-matrix"] is None


# ---- PEP 610: where a package was installed from ---------------------------------------------------------------


def fake_dist(site: Path, name: str, version: str, direct_url: Optional[dict] = None) -> None:
    """A dist-info folder as an installer leaves it: METADATA, and direct_url.json for a non-index install."""
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    if direct_url is not None:
        (info / "direct_url.json").write_text(json.dumps(direct_url))


def test_direct_url_reads_pep610_and_nothing_for_a_release(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_dist(tmp_path / "a", "peft", "0.13.2")
    fake_dist(tmp_path / "a", "trl", "0.1", {"url": "file:///src/trl", "dir_info": {"editable": True}})
    (tmp_path / "a" / "accelerate-1.0.dist-info").mkdir()
    (tmp_path / "a" / "accelerate-1.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: accelerate\n")
    (tmp_path / "a" / "accelerate-1.0.dist-info" / "direct_url.json").write_text("{not json")
    monkeypatch.syspath_prepend(str(tmp_path / "a"))
    assert installed.direct_url("peft") is None and installed.direct_url("no-such-package-fsdp-matrix") is None
    assert installed.direct_url("trl") == {"url": "file:///src/trl", "dir_info": {"editable": True}}
    assert installed.direct_url("accelerate") is None


def test_uncovered_names_each_cell_no_rule_matches() -> None:
    from fsdp_matrix.expectations import Expected

    got = installed.uncovered([("c/a-ws2", Expected("none")), ("c/b-ws2", Expected("ok")), ("c/s", Expected("skip"))])
    assert got == [
        "not covered: c/a-ws2: no rule of matrix.yaml matches it at the installed versions; it runs and fails"
    ]


def test_no_combo_of_matrix_yaml_may_take_the_installed_id(tmp_path: Path) -> None:
    from fsdp_matrix.errors import MatrixConfigError
    from fsdp_matrix.matrix import load_matrix
    from tests.helpers import matrix_data, write_matrix

    data = matrix_data()
    data["combos"][0]["id"] = "installed"
    with pytest.raises(
        MatrixConfigError, match=r"combos\[0\]\(installed\)\.id: 'installed' is the combo of the caller's own env"
    ):
        load_matrix(write_matrix(tmp_path, data))
