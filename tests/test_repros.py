"""The matrix itself: one test per cell of matrix.yaml, run for real on the installed versions.

Passes when the observed outcome matches the expectation (reproduced / fix-holds); see fsdp_matrix.pytest_plugin.
"""

from fsdp_matrix.pytest_plugin import check_record


def test_cell(cell, matrix_session, request):
    check_record(matrix_session.run(cell), request.node)
