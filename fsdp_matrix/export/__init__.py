"""Export: one self-contained PEP 723 script per cell (``script``, built by ``inline`` from the repro and the
workload, started by ``runtime``) and the markdown snippet for an upstream issue (``snippet``)."""
