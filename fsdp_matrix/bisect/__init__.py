"""Bisection: which release (or day) changed a cell's outcome.

``search`` is the algorithm over two Protocols; ``installers`` and ``runner`` are their real implementations
(pinned uv envs, the cell on a real launch); ``releases`` lists the candidates from the configured indexes.
"""
