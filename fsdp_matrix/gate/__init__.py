"""``nox -s gate``: a pull-request check. The selected cells run at a package's head and at its merge base with the
default branch; the cells whose outcome changed are listed with their verdicts at both ends, confirmed, and bisected
to the commit of the pull request that changed them.

The steps, one module each: ``request`` (the arguments), ``refs`` (head, base and the commits between),
``runs`` (cells at one commit), ``changes`` (what changed, how it counts, and the confirm seam), ``bisects`` (the
commit bisect of the changed cells), ``summary`` (markdown and JSON) and ``flow`` (the steps in order).
"""
