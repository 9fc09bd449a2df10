"""Reports of a matrix run: the grid of cells x combos as text, markdown, HTML, JSON and JUnit, and the diff of two.

``grid`` is the model every renderer reads; ``style`` is the one table of how each verdict looks; ``failure`` writes
what a failed cell says, for the pytest plugin, JUnit and HTML alike.
"""
