"""Loads the fsdp-matrix pytest plugin: matrix options (--results, --device, --world-size, --resume...) and the
session that runs cells in batched torchrun launches."""

pytest_plugins = ["fsdp_matrix.pytest_plugin"]
