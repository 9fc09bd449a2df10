"""The batched runner: many cells per torchrun launch, outliving hangs, crashes and one-rank errors.

``protocol`` holds every message between the launcher and the ranks; ``launcher`` starts and kills launches,
``watching`` reads their events and decides each cell's outcome, ``launchdir`` keeps their directories, and
``watchdog`` is the per-launch process that kills a launch whose coordinator died; ``worker`` is the rank side,
``hygiene`` what a rank checks between cells; ``procs`` kills and dumps processes; ``session`` turns what the
launcher saw into records; ``cli`` and ``bench`` are the commands.
"""
