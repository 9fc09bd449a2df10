"""The one installed-versions helper."""

from __future__ import annotations

from importlib import metadata

from fsdp_matrix.installed import installed_versions


def test_installed_and_missing_packages_in_the_order_given() -> None:
    got = installed_versions(["pydantic", "no-such-package-fsdp-matrix", "packaging"])
    assert list(got) == ["pydantic", "no-such-package-fsdp-matrix", "packaging"]
    assert got["pydantic"] == metadata.version("pydantic")
    assert got["no-such-package-fsdp-matrix"] is None
