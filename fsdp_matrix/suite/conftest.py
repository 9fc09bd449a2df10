"""The suite's conftest, for a run that gives its folder as a path with plugin autoloading off (then pytest reads
this file before parsing options). ``pytest --pyargs fsdp_matrix.suite`` loads the plugin through the entry point
instead (fsdp_matrix/suite/entry.py); ``pytest_plugins`` then names a plugin already loaded, which is a no-op."""

import pytest

from fsdp_matrix.suite.entry import default_combo

pytest_plugins = ["fsdp_matrix.pytest_plugin"]


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    default_combo(config)
