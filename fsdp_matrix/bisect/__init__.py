"""Bisection: which release, day or commit changed a cell's outcome.

``search`` is the algorithm over two Protocols; ``installers`` and ``runner`` are their real implementations
(pinned uv envs, the cells of a step on a real launch), and ``wiring`` builds that pair from the step options every
bisecting command declares. ``releases`` lists the candidate releases from the configured indexes, ``commits`` the
commits of a package's repository. ``cli`` (bisect), ``upgrade`` and ``nightly`` are the commands.
"""
