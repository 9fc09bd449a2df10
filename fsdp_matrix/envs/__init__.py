"""Pinned envs for the combos: index configuration, installs with uv, verification, stamps.

Modules, one concern each (``runner/`` and ``bisect/`` are laid out the same way):

- ``config``: the package-index configuration, read in one place (the user's uv settings, else pip's, translated);
- ``simple``: the one Simple-API client (indexes and find-links: files, yanked, sizes, upload times);
- ``installer``: one bounded ``uv pip install``, with the CUDA-build check on CPU runs;
- ``build``: ``prepare`` an env from pins: stamp, install, verify, reuse;
- ``check``: installed versions against the pins, missing files, imports;
- ``uvproc``: uv as a bounded child process in its own process group;
- ``downloads``: how much an install would download, announced before a CUDA torch.

Source pins (git and direct references) will get a module of their own here, ``sources``.

Everything other modules use is re-exported here: ``from fsdp_matrix import envs`` then ``envs.prepare(...)``.
"""

from fsdp_matrix.envs.build import (
    STAMP,
    EnvReport,
    invalidate_stamp,
    is_current,
    local_versions,
    prepare,
    requirements_hash,
    write_stamp,
)
from fsdp_matrix.envs.check import (
    DEFAULT_IMPORTS,
    import_check,
    inspect_env,
    installed_versions,
    mismatches,
    same_release,
)
from fsdp_matrix.envs.config import Locations, configured_locations, pip_config, uv_environment
from fsdp_matrix.envs.installer import InstallResult, cuda_packages, install, run_quiet

__all__ = [
    "DEFAULT_IMPORTS",
    "STAMP",
    "EnvReport",
    "InstallResult",
    "Locations",
    "configured_locations",
    "cuda_packages",
    "import_check",
    "inspect_env",
    "install",
    "installed_versions",
    "invalidate_stamp",
    "is_current",
    "local_versions",
    "mismatches",
    "pip_config",
    "prepare",
    "requirements_hash",
    "run_quiet",
    "same_release",
    "uv_environment",
    "write_stamp",
]
