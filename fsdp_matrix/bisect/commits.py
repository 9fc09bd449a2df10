"""``python -m fsdp_matrix bisect CELL --package peft --git REPO --good REF --bad REF``: which commit changed a cell.

The candidates are the first-parent commits from the merge base of GOOD and BAD to BAD (patch tags such as v0.13.2
sit on release branches, off main's line). GOOD is tested first when it is off the line, then the merge base: if
the merge base does not behave like GOOD, the line cannot answer the question and the command says so and stops.
Each step installs the combo's pins with the package built from a clean snapshot of that commit (``git archive``,
fsdp_matrix.envs.sources) into a step env keyed on the commit, reused from the cache. The search is bisect/search.py's
``bisect_cells`` over the ordered commits; a commit that does not build or import is skipped as ``git bisect skip``
would. The answer is the first commit whose observed outcome differs from GOOD's, with its subject, author date and
the PR number of a squash merge's ``(#NNNN)``, and the last unchanged commit.

The command is three modules by job: commit_request.py (the request, its checks, the line and the installer),
commit_search.py (the search) and commit_answer.py (the table, the answer and the JSON); this one runs them in
turn. Every name they define stays importable from here.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any, Dict, Optional, Sequence, Tuple

from fsdp_matrix.bisect.commit_answer import _answer_json, _installs, render, table, to_json  # noqa: F401
from fsdp_matrix.bisect.commit_request import (  # noqa: F401
    CommitInstaller,
    CommitRequest,
    Line,
    _held_pins,
    import_name,
    load,
    parser,
)
from fsdp_matrix.bisect.commit_search import Found, _check_good, _hooks, last_line, same_observation, search  # noqa: F401
from fsdp_matrix.errors import EnvError, MatrixError
from fsdp_matrix.git import Commit, describe, first_parent_line, git, pr_number, rev  # noqa: F401
from fsdp_matrix.usage import flat

_last_line = last_line  # its name before the split


def run(req: CommitRequest) -> Tuple[int, Optional[Dict[str, Any]]]:
    """The whole commit bisect: load -> search -> render; (exit code, the JSON answer, None when GOOD could not be
    tested). Raises MatrixError or EnvError (one line) for what it cannot do."""
    start = time.monotonic()
    q = load(req)
    found = search(q)
    if found.untested:
        return 1, None
    if found.stopped is not None:  # the merge base does not behave like GOOD: no answer per cell
        return found.stopped, to_json(q, Found(found.steps), {}, start)
    firsts = render(q, found, start)
    done = all(a.first_changed or a.answer.startswith("no change") for a in found.answers.values())
    return (0 if done else 1), to_json(q, found, firsts, start)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parser().parse_args(argv)
    try:
        code, data = run(CommitRequest.from_args(args))
    except (MatrixError, EnvError) as exc:
        print(f"fsdp-matrix bisect: {flat(exc)}", file=sys.stderr)
        return 2
    if args.json and data is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(data, indent=1, default=str))
    return code
