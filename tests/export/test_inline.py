"""Tests for fsdp_matrix.export.inline: dependency order, dropped and hoisted imports, and what it refuses."""

from __future__ import annotations

import ast
import textwrap

import pytest

from fsdp_matrix.export.inline import InlineError, flatten, is_stdlib


def _repro(tmp_path, body: str):
    path = tmp_path / "my_repro.py"
    path.write_text(textwrap.dedent(body).lstrip())
    return path


def test_modules_come_after_what_they_import(tmp_path):
    repro = _repro(
        tmp_path,
        '''
        """Doc of the repro."""
        from __future__ import annotations

        import os

        from fsdp_matrix.workload.recipe import peft_model, wrap_and_train
        from fsdp_matrix.workload.models import VOCAB as V

        CASE = "x"


        def run(params, ctx):
            # a comment that must survive
            return wrap_and_train(peft_model(params, ctx), params, ctx) if V and os.sep else {}


        if __name__ == "__main__":
            raise SystemExit("must be dropped")
        ''',
    )
    flat = flatten(repro)
    order = [s.module for s in flat.sections]
    assert order[-1] == "my_repro" and order[0] == "fsdp_matrix.errors"
    for before, after in [
        ("context", "models"),
        ("models", "wrapping"),
        ("wrapping", "recipe"),
        ("training", "recipe"),
        ("adapters", "training"),
    ]:
        assert order.index(f"fsdp_matrix.workload.{before}") < order.index(f"fsdp_matrix.workload.{after}")
    text = flat.sections[-1].text
    assert "V = VOCAB" in text and "# a comment that must survive" in text and '"""Doc of the repro."""' in text
    assert "must be dropped" not in text and "import" not in text
    assert "import os" in flat.stdlib_imports and "import torch" in flat.other_imports
    errors = flat.sections[0].text
    assert errors.startswith("class CheckFailed(AssertionError):") and "MatrixError" not in errors
    body = "\n".join(flat.stdlib_imports + flat.other_imports + [s.text for s in flat.sections])
    ast.parse(body)
    assert "fsdp_matrix" not in "".join(
        ast.unparse(n) for n in ast.walk(ast.parse(body)) if isinstance(n, (ast.Import, ast.ImportFrom))
    )


@pytest.mark.parametrize(
    "line, message",
    [
        ("from fsdp_matrix.cells import Cell", "harness code"),
        ("import fsdp_matrix.workload.models", "write `from fsdp_matrix.x import a`"),
        ("from .workload import models", "relative import"),
        ("from fsdp_matrix.workload.models import no_such_name", "does not define no_such_name"),
        ("from fsdp_matrix.workload.recipe import peft_model\ndef wrap(): pass", "'wrap' is also bound"),
        (
            "from fsdp_matrix.workload.recipe import peft_model\nfrom functools import wraps as nn",
            "'nn' is torch.nn here and functools.wraps",
        ),
    ],
)
def test_refuses_what_one_flat_script_cannot_hold(tmp_path, line, message):
    with pytest.raises(InlineError, match=message):
        flatten(_repro(tmp_path, line + "\n"))


def test_is_stdlib():
    assert is_stdlib("os.path") and is_stdlib("importlib.metadata")
    assert not is_stdlib("torch.distributed") and not is_stdlib("peft")


def test_a_repro_through_the_facade_inlines_like_one_through_the_home_modules(tmp_path):
    repro = _repro(
        tmp_path,
        """
        from fsdp_matrix.case import RankContext, main, wrap_and_train as train


        def run(params, ctx: RankContext):
            return train(None, params, ctx)


        if __name__ == "__main__":
            main(run, "x")
        """,
    )
    flat = flatten(repro)
    order = [s.module for s in flat.sections]
    assert "fsdp_matrix.workload.recipe" in order and "fsdp_matrix.workload.context" in order
    assert "fsdp_matrix.standalone" not in order and "fsdp_matrix.case" not in order
    assert "train = wrap_and_train" in flat.sections[-1].text


def test_the_facade_module_becomes_a_namespace_of_the_names_read_from_it(tmp_path):
    module = _repro(
        tmp_path,
        """
        from fsdp_matrix import case as api


        def run(params, ctx):
            return api.wrap_and_train(api.peft_model(params, ctx), params, ctx)


        if __name__ == "__main__":
            api.main(run, "x")
        """,
    )
    flat = flatten(module)
    text = flat.sections[-1].text
    assert "api = types.SimpleNamespace(peft_model=peft_model, wrap_and_train=wrap_and_train)" in text
    assert "import types" in flat.stdlib_imports
    assert "fsdp_matrix.workload.recipe" in [s.module for s in flat.sections]
    assert "main" not in text.split("def run")[0]  # the standalone entry point is the script's own runtime


def test_import_torch_distributed_as_dist_is_the_same_dist_the_harness_imports(tmp_path):
    """``import torch.distributed as dist`` was refused: "'dist' is imported as torch.distributed. here and as
    torch.distributed in another inlined module" (the harness writes ``from torch import distributed as dist``)."""
    repro = _repro(
        tmp_path,
        """
        import torch.distributed as dist

        from fsdp_matrix.case import wrap_and_train


        def run(params, ctx):
            dist.barrier()
            return wrap_and_train(None, params, ctx)
        """,
    )
    flat = flatten(repro)
    assert "import torch.distributed as dist" in flat.other_imports
