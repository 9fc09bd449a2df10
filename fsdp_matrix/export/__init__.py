"""Export: one self-contained PEP 723 script per cell (``script``: the case's hand-written upstream script from
repros/upstream/ where one names the cell, else the repro flattened with the workload by ``inline``; started by
``launch`` and ``rank``), the markdown snippet for an upstream issue (``snippet``), and the run of a script alone
that judges it as the matrix would (``verify``)."""
