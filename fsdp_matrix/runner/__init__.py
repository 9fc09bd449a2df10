"""The batched runner: many cells per torchrun launch, outliving hangs, crashes and one-rank errors.

``protocol`` holds every message between the launcher and the ranks; ``launcher`` starts and kills launches and
carries out what ``watching.decide`` makes of their events (each cell's outcome, a launch to retire); ``launchdir``
keeps their directories and reads the ranks' events and torchrun's logs out of them, and
``watchdog`` is the per-launch process that kills a launch whose coordinator died; ``worker`` is the rank side,
``hygiene`` what a rank checks between cells; ``procs`` kills and dumps processes; ``session`` turns what the
launcher saw into records; ``cli`` and ``bench`` are the commands.
"""
