"""The cells as a pytest suite in the caller's env: ``pytest --pyargs fsdp_matrix.suite``.

Upstream CI installs the harness with its cases (``pip install "fsdp-matrix @ git+URL@SHA"``) into its own env and
runs this package: every cell that applies to the installed versions, judged by matrix.yaml's rules, filed as the
``installed`` combo. ``-m cpu_gate`` is the CPU gate, ``-m gpu_nightly`` the GPU nightly; ``--report-log`` and
``--junitxml`` carry each cell's verdict, signatures and versions (docs/pages/upstream-ci.md).
"""
