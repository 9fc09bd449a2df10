"""The batched runner: many cells per torchrun launch, outliving hangs, crashes and one-rank errors.

``protocol`` holds every message between the launcher and the ranks; ``launcher`` starts and watches launches;
``worker`` is the rank side, ``hygiene`` what a rank checks between cells; ``procs`` kills and dumps processes;
``session`` turns what the launcher saw into records; ``cli`` and ``bench`` are the commands.
"""
