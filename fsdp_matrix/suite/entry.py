"""The pytest11 entry point behind ``pytest --pyargs fsdp_matrix.suite``: inert unless the run names this suite.

pytest reads a ``conftest.py`` before it parses options only for paths given on the command line, not for a
``--pyargs`` module name (``_pytest.config.PytestPluginManager._set_initial_conftests``), so the suite's own conftest
comes too late to add ``--device``, ``--results``... This module is loaded with every pytest run in an env where
fsdp-matrix is installed, and so must not change any other suite: it imports the fsdp-matrix plugin, whose options
could clash with a project's own, only when the arguments name ``fsdp_matrix.suite`` (or its folder). With plugin
autoloading off (``PYTEST_DISABLE_PLUGIN_AUTOLOAD``), ``-p fsdp_matrix.pytest_plugin`` does the same.
"""

from __future__ import annotations

from pathlib import Path
from typing import List

import pytest

SUITE = "fsdp_matrix.suite"
HERE = Path(__file__).resolve().parent
PLUGIN = "fsdp_matrix.pytest_plugin"
_ASKED = pytest.StashKey[bool]()


def names_the_suite(args: List[str]) -> bool:
    """Does a positional argument name this suite: ``fsdp_matrix.suite[.test_cells][::...]`` or a path inside it?"""
    for arg in args:
        if arg.startswith("-"):
            continue
        head = arg.split("::", 1)[0]
        if head == SUITE or head.startswith(SUITE + "."):
            return True
        try:
            path = Path(head).resolve()
        except (OSError, ValueError):
            continue
        if path == HERE or HERE in path.parents:
            return True
    return False


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config, parser: pytest.Parser, args: List[str]) -> None:
    if names_the_suite(args):
        early_config.stash[_ASKED] = True
        early_config.pluginmanager.import_plugin(PLUGIN)  # its options are added now, before args are parsed


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    if config.stash.get(_ASKED, False):
        default_combo(config)


def default_combo(config: pytest.Config) -> None:
    """Records of the suite are filed under the ``installed`` combo unless ``--combo`` names another: run before the
    plugin's pytest_configure validates the options."""
    from fsdp_matrix.installed import INSTALLED

    if getattr(config.option, "combo", None) is None:
        config.option.combo = INSTALLED
