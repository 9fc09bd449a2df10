"""A prepared device check: everything one short, network-less GPU run needs, written ahead of time.

``nox -s device -- --prepare DIR`` (``python -m fsdp_matrix.device --prepare DIR``) writes into DIR the wheels the
device image lacks (one ``--target`` site per set of versions), a plan of the cells (``plan.json``) and ``run.sh``.
``bash DIR/run.sh --out OUT`` runs the plan there; ``bash DIR/run.sh --rehearse`` runs it here on CPU, against a venv
holding the image's versions. docs/pages/gpu.md is the manual.

Modules: ``image`` (what the device image holds, and the sites to carry), ``wheels`` (fetching a site's wheels and
the ones they need), ``plan`` (which cells, in which call), ``prepare`` (the command), ``execute`` (what run.sh
runs), ``probe`` (two ranks on one GPU), ``rehearse`` (the local venv).
"""
