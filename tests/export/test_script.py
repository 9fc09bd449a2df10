"""Tests for fsdp_matrix.export: the exported script, its PEP 723 block, the issue snippet, and one real run."""

from __future__ import annotations

import ast
import builtins
import dataclasses
import importlib.util
import re
import time
from pathlib import Path

import pytest

from fsdp_matrix import records
from fsdp_matrix.cells import expand_case
from fsdp_matrix.expectations import expected_for
from fsdp_matrix.export.cli import main
from fsdp_matrix.export.inline import is_stdlib
from fsdp_matrix.export.script import prepare, render_script, upstream_cells
from fsdp_matrix.export.snippet import code_block, code_span, render_markdown
from fsdp_matrix.export.verify import POISON, installed_versions, matching_combo_id, run_alone
from fsdp_matrix.matrix import DEFAULT_MATRIX, load_matrix
from fsdp_matrix.records import Observed, RankResult, Record
from fsdp_matrix.verdicts import Verdict

try:
    import tomllib
except ImportError:  # Python < 3.11
    tomllib = pytest.importorskip("tomli")

ROOT = DEFAULT_MATRIX.parent
MATRIX = load_matrix()
DORA = "dora-sharded-weight/dora-fp32-orig1-peft_policy-llama-ws2"
CHEAP = "no-split-modules/lora-orig0-cls_env_bogus-shape_plain-ws2"
"""Fails in fsdp_auto_wrap_policy before any training, with the same message on every PEFT release."""
THIRD_PARTY = {"torch", "peft", "transformers", "accelerate", "bitsandbytes", "trl"}
# hard requirements of transformers, peft and trl (their metadata's Requires-Dist), so the pins above install them
# yaml: pyyaml is a requirement of accelerate and of transformers (init: launcher writes an accelerate config)
TRANSITIVE = {"safetensors", "tokenizers", "datasets", "yaml"}
PEP723 = re.compile(r"(?m)^# /// (?P<type>[a-zA-Z0-9-]+)$\s(?P<content>(^#(| .*)$\s)+)^# ///$")
"""The reference regex of PEP 723."""


def _script(ref: str, combo: str = None, results: Path = Path("/nonexistent")) -> str:
    return render_script(prepare(MATRIX, ref, combo, results, ROOT))


def _pep723(script: str) -> dict:
    blocks = [m for m in PEP723.finditer(script) if m.group("type") == "script"]
    assert len(blocks) == 1
    content = "".join(
        line[2:] if line.startswith("# ") else line[1:] for line in blocks[0].group("content").splitlines(keepends=True)
    )
    return tomllib.loads(content)


def _imported_modules(tree: ast.AST) -> set:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            out.add(node.module or "")
    return out


def _unbound_names(tree: ast.AST) -> set:
    """Names read somewhere but bound nowhere in the script nor builtin: what a dropped import would leave behind."""
    bound, read = set(dir(builtins)) | {"__file__", "__name__"}, set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (read if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
    return read - bound


def _one_cell_per_case():
    return [f"{case.id}/{expand_case(case)[0].id}" for case in MATRIX.cases]


@pytest.mark.parametrize("ref", _one_cell_per_case())
def test_script_is_self_contained(ref):
    script = _script(ref)
    tree = ast.parse(script)
    modules = _imported_modules(tree)
    assert not [m for m in modules if m.split(".")[0] == "fsdp_matrix"], modules
    assert "fsdp_matrix." not in "".join(ast.unparse(n) for n in ast.walk(tree) if isinstance(n, ast.ImportFrom))
    outside = {m.split(".")[0] for m in modules if not is_stdlib(m)} - THIRD_PARTY - TRANSITIVE - {"__future__"}
    assert not outside, f"the script imports {outside}, which the PEP 723 block does not install"
    assert not _unbound_names(tree)
    # the user's index configuration decides where packages come from (links to upstream reports are fine)
    assert not re.search(r"https?://(?!github\.com/)|file://|index-url|find-links|\[tool\.uv", script)
    assert "def run(params" in script and "def rank_main(" in script
    assert "class RankContext" in script or "rank_main(run, Context," in script
    # what a maintainer pastes upstream names no machine
    assert str(ROOT) not in script and not re.search(r"(?<![\w.:/])/(root|work|home|tmp|usr)/", script)


def test_pep723_block_has_the_exact_pins():
    script = _script(DORA, combo="old")
    meta = _pep723(script)
    combo = MATRIX.combo("old")
    assert meta["dependencies"] == [f"{n}=={v}" for n, v in combo.pins.model_dump().items()] + list(combo.extra)
    assert "torch==2.13.0" in meta["dependencies"] and "peft==0.13.2" in meta["dependencies"]
    assert meta["requires-python"] == ">=3.9"
    # the block must come before any code, and the docstring must survive (it explains the report)
    assert script.startswith("# /// script\n")
    assert "lora_A.weight.shape[1]" in script and "DoRA under FSDP1" in script
    assert "PARAMS = {'adapter': 'dora', 'dtype': 'fp32', 'model': 'llama', 'orig': 1, 'wrap': 'peft_policy'}" in script


def test_torch_is_imported_after_the_launcher_returns():
    script = _script(DORA)
    tree = ast.parse(script)
    guard = next(i for i, n in enumerate(tree.body) if isinstance(n, ast.If) and "relaunch" in ast.unparse(n))
    # functions may import torch (the launcher never calls them); module-level statements may not, before the guard
    heavy = [
        i
        for i, n in enumerate(tree.body)
        if not isinstance(n, (ast.FunctionDef, ast.ClassDef))
        and {m.split(".")[0] for m in _imported_modules(n)} & THIRD_PARTY
    ]
    assert heavy and min(heavy) > guard


TRACEBACK = (
    'Traceback (most recent call last):\n  File "x.py", line 3, in f\n    s = """```not a fence```"""\n'
    "ValueError: Must flatten tensors with uniform `requires_grad` when `use_orig_params=False` | x\n"
)


def _record(combo: str, finished_at: float, message: str, traceback: str = TRACEBACK) -> Record:
    cell = "lora-fp32-orig0-decoder_layer-llama-ws2"
    rank = RankResult(
        rank=0,
        status="error",
        error_type="ValueError",
        error_message=message,
        location="torch.distributed.fsdp._flat_param.f",
        traceback=traceback,
    )
    observed = Observed(
        status="error",
        error_type="ValueError",
        error_message=message,
        location="torch.distributed.fsdp._flat_param.f",
        ranks=[rank],
    )
    versions = {
        "torch": "2.13.0+cpu",
        "peft": "0.21.2",
        "transformers": "5.23.0",
        "accelerate": "1.15.0",
        "bitsandbytes": "0.50.2",
        "python": "3.11.7",
    }
    return Record(
        case="lora-requires-grad",
        cell=cell,
        params={},
        versions=versions,
        device="cpu",
        world_size=2,
        expected={"kind": "error"},
        observed=observed,
        verdict="reproduced",
        duration_s=1.0,
        combo=combo,
        finished_at=finished_at,
    )


def test_markdown_holds_the_newest_record_verbatim(tmp_path):
    message = "Must flatten tensors with uniform `requires_grad` when `use_orig_params=False`"
    now = time.time()
    records.append(tmp_path / "current", _record("current", now - 100, "older", "Traceback: old one\n"))
    records.append(tmp_path / "current", _record("current", now, message))
    records.append(tmp_path / "nested" / "other", _record("old", now + 100, "another combo", "Traceback: old combo\n"))
    exp = prepare(MATRIX, "lora-requires-grad/lora-fp32-orig0-decoder_layer-llama-ws2", "current", tmp_path, ROOT)
    md = render_markdown(exp)
    assert TRACEBACK.rstrip() in md and "old one" not in md and "old combo" not in md
    assert "````text\n" + TRACEBACK.rstrip() + "\n````" in md  # the fence outgrows the ``` inside
    assert f"`` ValueError: {message} ``" in md
    assert "| python | - | 3.11.7 |" in md and "| torch | 2.13.0 | 2.13.0+cpu |" in md
    assert md.startswith("### LoRA + FSDP1") and "(ValueError)" in md.splitlines()[0]
    assert f"uv run {exp.stem}.py" in md and "pip install torch==2.13.0 peft==0.21.2" in md
    assert "\\`" not in md and "\\_" not in md


def test_markdown_says_when_the_record_ran_other_versions_than_the_pins(tmp_path):
    """A record of combo ``current`` made with peft 0.20.0 / transformers 4.57.6 was shown as "Observed" under the
    pins' header, without a word; a source build showed its version without its commit."""
    cell = "lora-requires-grad/lora-fp32-orig0-decoder_layer-llama-ws2"
    rec = _record("current", time.time(), "Must flatten tensors")
    other = dataclasses.replace(rec, versions={**rec.versions, "peft": "0.20.0", "transformers": "4.57.6"})
    records.append(tmp_path / "other", other)
    md = render_markdown(prepare(MATRIX, cell, "current", tmp_path / "other", ROOT))
    [note] = [line for line in md.splitlines() if "not the pins" in line]
    assert "peft 0.20.0" in note and "transformers 4.57.6" in note and "torch" not in note
    commit = "5d602fdbff04c33c1c4d" + "0" * 20
    built = dataclasses.replace(
        rec,
        versions={**rec.versions, "peft": "0.20.1.dev0"},
        sources={"peft": {"url": "/src/peft", "ref": "main", "commit": commit, "dirty": None, "release": "0.20.0"}},
    )
    records.append(tmp_path / "src", built)
    md = render_markdown(prepare(MATRIX, cell, "current", tmp_path / "src", ROOT))
    assert "| peft | 0.21.2 | 0.20.1.dev0 @ 5d602fd |" in md


def test_markdown_renders_code_as_written(tmp_path):
    markdown_it = pytest.importorskip("markdown_it")
    message = "`x` | y ``` z"
    records.append(tmp_path, _record("current", time.time(), message))
    md = render_markdown(
        prepare(MATRIX, "lora-requires-grad/lora-fp32-orig0-decoder_layer-llama-ws2", "current", tmp_path, ROOT)
    )
    html = markdown_it.MarkdownIt("commonmark").render(md)
    assert f"<code>ValueError: {message}</code>" in html
    assert "```not a fence```" in html and html.count("<pre>") == 2


def test_markdown_without_record_says_how_to_get_the_traceback(tmp_path):
    exp = prepare(MATRIX, DORA, None, tmp_path / "missing", ROOT)
    md = render_markdown(exp)
    assert "no record of this cell" in md and "tuple index out of range" in md and f"`{exp.stem}.py`" in md
    assert "recorded" not in md.split("**To reproduce**")[0]


def test_code_span_and_block():
    assert code_span("plain") == "`plain`"
    assert code_span("a `b` c") == "``a `b` c``"
    assert code_span("`b`") == "`` `b` ``"
    assert code_block("x ``` y").startswith("````\n")
    assert code_block("x", "text") == "```text\nx\n```"


def test_cli_writes_script_and_snippet(tmp_path, capsys):
    argv = [DORA.split("/")[1], "--out", str(tmp_path), "--results", str(tmp_path / "r")]
    assert main(argv) == 0
    written = capsys.readouterr().out.split()
    stem = "repro_dora-sharded-weight_dora-fp32-orig1-peft_policy-llama-ws2"
    assert written == [str(tmp_path / f"{stem}.py"), str(tmp_path / f"{stem}.md")]
    assert "combo current" in (tmp_path / f"{stem}.py").read_text()


def _has_workload_packages() -> bool:
    return all(importlib.util.find_spec(name) is not None for name in ("torch", "peft", "transformers", "bitsandbytes"))


ORIGINALS = {
    "lora-requires-grad": "lora-fp32-orig0-decoder_layer-llama-ws2",
    "dora-sharded-weight": "dora-fp32-orig1-peft_policy-llama-ws2",
    "mixed-dtype": "lora-bf16-orig1-decoder_layer-llama-autocast1-ws2",
    "no-split-modules": "lora-orig0-cls_env_unset-shape_plain-ws2",
}
"""The four reports the matrix started from (peft#1702, #1984, #2129, #2166), each by the cell that shows it."""
LIMIT = 150
"""Target length of an original report's export: what a maintainer reads in an issue."""


@pytest.mark.parametrize("case_id", ORIGINALS)
def test_an_original_exports_its_hand_written_upstream_script(case_id):
    exp = prepare(MATRIX, f"{case_id}/{ORIGINALS[case_id]}", "old", Path("/nonexistent"), ROOT)
    assert exp.upstream == ROOT / "repros" / "upstream" / exp.repro.name
    script = render_script(exp)
    lines = len(script.splitlines())
    assert lines <= LIMIT, f"{lines} lines: an original report's export must fit in {LIMIT}"
    assert "CELLS" not in script and "hand-written upstream script" in script


def test_a_cell_no_upstream_script_names_is_flattened():
    exp = prepare(MATRIX, "lora-requires-grad/lora-fp32-orig1-decoder_layer-llama-ws2", "old", Path("/x"), ROOT)
    assert exp.upstream is None and exp.source == exp.repro
    assert "class RankContext" in render_script(exp)


def test_every_upstream_script_names_cells_of_its_case():
    for path in sorted((ROOT / "repros" / "upstream").glob("*.py")):
        case = next(c for c in MATRIX.cases if c.repro == f"repros/{path.name}")
        ids = {c.id for c in expand_case(case)}
        assert upstream_cells(path) and set(upstream_cells(path)) <= ids, path.name


ALONE_IN_TESTS = "lora-requires-grad"
"""The original whose export ``nox -s tests`` runs alone (about 12 s on 2 cores); ``nox -s heavy`` runs all four."""


@pytest.mark.skipif(not _has_workload_packages(), reason="needs torch, peft, transformers, bitsandbytes installed")
@pytest.mark.parametrize(
    "case_id", [pytest.param(c, marks=[] if c == ALONE_IN_TESTS else [pytest.mark.heavy]) for c in ORIGINALS]
)
def test_exported_script_reproduces_alone(tmp_path, case_id):
    """Export an original report's cell, then run the script alone (empty folder, the repo unreachable, see
    verify.py): it must give the verdict the matrix gives that cell with these versions."""
    versions = _installed()
    case = MATRIX.case(case_id)
    cell = next(c for c in expand_case(case) if c.id == ORIGINALS[case_id])
    expected = expected_for(case, cell, versions)
    combo = matching_combo_id(MATRIX, versions)
    work = tmp_path / "empty"
    argv = [f"{case_id}/{cell.id}", "--out", str(work), "--results", str(tmp_path / "none")]
    assert main(argv + (["--combo", combo] if combo else [])) == 0
    script = next(work.glob("*.py"))
    alone = run_alone(script, timeout=300)
    out = alone.output
    want = Verdict.REPRODUCED if expected.kind == "error" else Verdict.FIX_HOLDS
    assert alone.judge(expected).verdict == want, out
    assert alone.returncode == (1 if expected.kind == "error" else 0), out
    assert "===== rank 0: error" in out and "===== rank 1: error" in out or expected.kind == "ok", out
    assert POISON.strip() not in out and "ChildFailedError" not in out, out
    assert not [n for n in alone.leftovers if n.startswith("fsdp-repro-")], "the ranks' scratch folder was left behind"
    assert len(script.read_text().splitlines()) <= LIMIT


def _installed() -> dict:
    return installed_versions(MATRIX)


def test_markdown_holds_no_absolute_path_and_no_host(tmp_path):
    venv = f"{ROOT}/.nox/matrix-current/lib/python3.11/site-packages"
    traceback = (
        "Traceback (most recent call last):\n"
        f'  File "{ROOT}/fsdp_matrix/runner/worker.py", line 3, in run_cell\n'
        f'  File "{venv}/torch/distributed/fsdp/_flat_param.py", line 9, in f\n'
        '  File "/root/.pyenv/versions/3.11.7/lib/python3.11/contextlib.py", line 81, in inner\n'
        '  File "/tmp/fsdp-matrix-1a2b/scratch/x.py", line 2, in g\n'
        "ValueError: on build-host-7 reading /home/alice/ckpt/adapter.bin\n"
    )
    rec = _record("current", time.time(), "on build-host-7 reading /home/alice/ckpt/adapter.bin", traceback)
    rec = dataclasses.replace(rec, host="build-host-7")
    records.append(tmp_path, rec)
    md = render_markdown(
        prepare(MATRIX, "lora-requires-grad/lora-fp32-orig0-decoder_layer-llama-ws2", "current", tmp_path, ROOT)
    )
    assert 'File "fsdp_matrix/runner/worker.py"' in md and 'File "torch/distributed/fsdp/_flat_param.py"' in md
    assert 'File "contextlib.py"' in md and ".../adapter.bin" in md
    assert "build-host-7" not in md and str(ROOT) not in md and "/home/" not in md and "/tmp/" not in md
    assert not re.search(r"(?<![\w.:/])/(root|work|home|tmp|usr)/", md)


def test_markdown_says_when_the_rule_changed_since_the_record(tmp_path):
    """The snippet quoted a stored verdict whose rule had changed since, as if matrix.yaml still judged it so."""
    cell = "lora-requires-grad/lora-fp32-orig0-decoder_layer-llama-ws2"
    now = prepare(MATRIX, cell, "current", tmp_path / "none", ROOT).expected
    rec = _record("current", time.time(), "Must flatten tensors")
    records.append(tmp_path / "same", dataclasses.replace(rec, expected=now.to_json()))
    md = render_markdown(prepare(MATRIX, cell, "current", tmp_path / "same", ROOT))
    assert "rule for this cell changed" not in md
    old = {**now.to_json(), "kind": "ok", "error_type": None, "match": None}
    records.append(tmp_path / "changed", dataclasses.replace(rec, expected=old))
    md = render_markdown(prepare(MATRIX, cell, "current", tmp_path / "changed", ROOT))
    [note] = [line for line in md.splitlines() if "rule for this cell changed" in line]
    assert "training passes every check" in note and "ValueError" in note and "the old rule's" in note, note


def test_export_pins_a_release_no_combo_pins(tmp_path, capsys):
    """``export`` could only use a combo's pins: the script got pins under which the bug does not show."""
    argv = [DORA.split("/")[1], "--out", str(tmp_path), "--results", str(tmp_path / "r"), "--pin", "accelerate==0.34.2"]
    assert main(argv) == 0
    script = Path(capsys.readouterr().out.split()[0]).read_text()
    assert '"accelerate==0.34.2"' in script and "accelerate==1.15.0" not in script
    exp = prepare(MATRIX, DORA, "current", tmp_path / "r", ROOT, {"peft": "0.13.2"})
    assert exp.combo.pins.peft == "0.13.2" and exp.combo.pins.accelerate == MATRIX.combo("current").pins.accelerate
    from fsdp_matrix.cli import main as fsdp_matrix_main

    assert fsdp_matrix_main(["export", *argv[:-1], "accelerate==0.34.*"]) == 2
    assert "exact version" in capsys.readouterr().err
