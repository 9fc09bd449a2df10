"""``triage``: pasted tracebacks, as users pasted them upstream, name the right case.

The fixtures under tests/fixtures/triage/ are quoted from the upstream threads (each names its URL in its header),
plus variants constructed from them (other paths, trimmed, wrapped, qualified) and four tracebacks taken from this
branch's own records. The rules were written from those reports' messages, so a test on the records alone would be
circular; the upstream pastes differ from them in wording (torch 2.0's ```FlatParameter` requires``), layout and
paths.
"""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest

from fsdp_matrix import cli
from fsdp_matrix.matrix import load_matrix
from fsdp_matrix.records import Observed, Record, append
from fsdp_matrix.triage import cli as triage_cli
from fsdp_matrix.triage.match import claims, match, nearest_combo, platform_hits
from fsdp_matrix.triage.parse import MAX_BYTES, module_of, parse

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "triage"
MATRIX = load_matrix(ROOT / "matrix.yaml")


def paste_of(name: str) -> str:
    """The fixture without its header comment: what the user pasted."""
    lines = (FIXTURES / name).read_text().splitlines()
    while lines and lines[0].startswith("# "):
        lines.pop(0)
    return "\n".join(lines) + "\n"


EXPECTED = {
    # the four original reports, as pasted upstream
    "peft1702_title.txt": "lora-requires-grad",
    "transformers27542_flatparameter.txt": "lora-requires-grad",
    "llamafactory3550_dora_rank0.txt": "dora-sharded-weight",
    "llamafactory3550_dora_rank1_trimmed.txt": "dora-sharded-weight",
    "peft484_uniform_dtype_backticks.txt": "mixed-dtype",
    "peft484_uniform_dtype_prose.txt": "mixed-dtype",
    "llamacookbook675_integer_dtype.txt": "mixed-dtype",
    "axolotl1494_reversed_dtype.txt": "mixed-dtype",
    "peft2129_device_ipython.txt": "merge-device",
    "accelerate2872_no_split.txt": "no-split-modules",
    "peft2167_pix2struct.txt": "no-split-modules",
    # variants: other paths, trimmed, wrapped, qualified, followed by torchrun's summary
    "variant_dora_windows_conda.txt": "dora-sharded-weight",
    "variant_dora_source_checkout.txt": "dora-sharded-weight",
    "variant_requires_grad_pytest_wrapped.txt": "lora-requires-grad",
    "variant_no_split_torchrun_tail.txt": "no-split-modules",
    # this matrix's own records (the rules' messages: circular alone, kept beside the upstream ones)
    "records_lora_requires_grad.txt": "lora-requires-grad",
    "records_dora_sharded_weight.txt": "dora-sharded-weight",
    "records_mixed_dtype.txt": "mixed-dtype",
    "records_no_split_modules.txt": "no-split-modules",
}


def test_every_fixture_is_tested():
    assert sorted([*EXPECTED, "unrelated_galore.txt"]) == sorted(p.name for p in FIXTURES.glob("*.txt"))


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_paste_names_the_right_case_first(name):
    found = match(MATRIX, parse(paste_of(name)))
    assert found, f"{name}: nothing matched"
    ranked = [(m.case.id, m.score) for m in found[:4]]
    assert found[0].case.id == EXPECTED[name], ranked
    # ahead on its own merit, not by matrix.yaml's order among equals
    assert len(found) == 1 or found[0].score > found[1].score, ranked


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_paste_is_claimed_with_an_evidence_level(name):
    # merge-device's message is any library's: its rule's frame hints tell it apart
    found = claims(match(MATRIX, parse(paste_of(name))))
    assert found and found[0].case.id == EXPECTED[name] and found[0].level in ("strong", "likely", "weak")


def test_unrelated_error_matches_nothing_and_suggests_export(capsys):
    assert match(MATRIX, parse(paste_of("unrelated_galore.txt"))) == []
    code = triage_cli.main([str(FIXTURES / "unrelated_galore.txt"), "--versions", "peft=0.13.2"])
    out = capsys.readouterr().out
    assert code == 1
    assert "No known case matches" in out and "python -m fsdp_matrix export CELL" in out


@pytest.mark.parametrize(
    "path,module",
    [
        ("/x/lib/python3.11/site-packages/peft/tuners/lora/dora.py", "peft.tuners.lora.dora"),
        ("/usr/lib/python3/dist-packages/torch/distributed/fsdp/_flat_param.py", "torch.distributed.fsdp._flat_param"),
        (r"C:\Users\me\miniconda3\envs\ft\Lib\site-packages\peft\utils\other.py", "peft.utils.other"),
        ("/home/me/src/peft/src/peft/tuners/lora/dora.py", "peft.tuners.lora.dora"),
        ("/src/pytorch/torch/distributed/fsdp/__init__.py", "torch.distributed.fsdp"),
        ("/home/me/project/train.py", None),
    ],
)
def test_module_from_path(path, module):
    assert module_of(path) == module


def test_parse_reads_exception_and_frames_through_the_noise():
    paste = parse(paste_of("variant_requires_grad_pytest_wrapped.txt"))
    assert [(e.type, e.short_type) for e in paste.errors] == [("builtins.ValueError", "ValueError")]
    assert paste.errors[0].message == "Must flatten tensors with uniform requires_grad when use_orig_params=False"
    assert paste.modules == ["torch.distributed.fsdp._flat_param"]
    ipython = parse(paste_of("peft2129_device_ipython.txt"))
    assert ipython.modules == ["peft.tuners.lora.model"]
    cut = parse(paste_of("llamafactory3550_dora_rank1_trimmed.txt"))
    assert cut.modules == ["peft.tuners.lora.dora"]
    assert [e.message for e in cut.errors] == ["tuple index out of range"]


def test_a_loose_fit_is_claimed_lower_and_not_under_another_class():
    reversed_dtypes = "ValueError: Must flatten tensors with uniform dtype but got torch.float32 and torch.bfloat16\n"
    found = match(MATRIX, parse(reversed_dtypes))
    assert found[0].case.id == "mixed-dtype" and any("loose fit" in n for n in found[0].hits[0].notes)
    assert found[0].level in ("likely", "weak")  # a loose fit is never strong
    assert claims(match(MATRIX, parse(reversed_dtypes.replace("ValueError", "KeyError")))) == []
    # the uniform requires_grad rules share only "must flatten tensors with uniform" with a dtype message
    assert "lora-requires-grad" not in [m.case.id for m in found]


def test_a_frame_elsewhere_lowers_the_fit_and_is_not_claimed():
    inside = match(MATRIX, parse(paste_of("llamafactory3550_dora_rank0.txt")))[0]
    elsewhere = match(
        MATRIX, parse('  File "/x/site-packages/galore/proj.py", line 15, in f\nIndexError: tuple index out of range\n')
    )[0]
    assert elsewhere.case.id == "dora-sharded-weight"
    assert elsewhere.score < inside.score
    assert any("no pasted frame is in peft.tuners.lora.dora" in n for h in elsewhere.hits for n in h.notes)
    assert elsewhere.level is None and elsewhere.against.startswith("similar message, but")


def _record(case: str, cell: str, verdict: str, peft: str, combo: str, error=None, rule=None, expected=None) -> Record:
    kind, message = error or (None, None)
    return Record(
        case=case,
        cell=cell,
        params={},
        versions={"torch": "2.13.0", "peft": peft, "transformers": "4.46.3", "accelerate": "1.1.1"},
        device="cpu",
        world_size=2,
        expected={"kind": "error" if error else "ok", "rule": rule, **(expected or {})},
        observed=Observed(
            status="error" if error else "ok",
            error_type=error[0] if error else None,
            error_message=error[1] if error else None,
        ),
        verdict=verdict,
        duration_s=1.0,
        combo=combo,
    )


NO_SPLIT = {"error_type": "Exception", "match": "Could not find the transformer layer class to wrap in the model"}


def test_cli_prints_links_versions_and_observed_workarounds(tmp_path, capsys):
    cell = "lora-orig0-cls_env_unset-shape_plain-ws2"
    msg = ("Exception", "Could not find the transformer layer class to wrap in the model.")
    for rec in (
        # the rule index is main's before the platform rules moved it: records are matched by their signature
        _record("no-split-modules", cell, "reproduced", "0.13.2", "old", msg, rule=3, expected=NO_SPLIT),
        _record("no-split-modules", cell, "fix-holds", "0.14.0", "peft0.14-tf4.47", rule=4),
    ):
        append(tmp_path / rec.combo, rec)
    code = cli.main(
        [
            "triage",
            str(FIXTURES / "accelerate2872_no_split.txt"),
            "--results",
            str(tmp_path),
            "--versions",
            "peft=0.13.2",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert out.index("1. no-split-modules") < out.index("https://github.com/huggingface/peft/issues/2166")
    assert "reproduces (rule): peft <0.14; yours are in range" in out
    assert "fixed (rules): peft >=0.14" in out
    assert "observed reproduced (records): old (" in out
    assert "observed fixed, same cells (records): peft0.14-tf4.47 (" in out
    assert out.startswith(f"records: 2 read from {tmp_path}\n")


def test_a_record_no_rule_expected_is_shown_with_its_verdict(tmp_path, capsys):
    msg = ("IndexError", "tuple index out of range")
    rec = _record(
        "dora-sharded-weight", "dora-fp32-orig1-decoder_layer-llama-ws2", "DIFFERENT-ERROR", "0.22.0", "x", msg
    )
    append(tmp_path, rec)
    (tmp_path / "cells.jsonl").open("a").write('{"torn": \n')
    code = triage_cli.main([str(FIXTURES / "llamafactory3550_dora_rank0.txt"), "--results", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0
    assert "observed with this error, verdict DIFFERENT-ERROR (records): x (" in out
    assert "1 lines skipped (not records" in out.splitlines()[0]


def test_workarounds_on_the_users_versions_are_the_cases_ok_cells(capsys):
    code = triage_cli.main([str(FIXTURES / "peft1702_title.txt"), "--versions", "torch=2.13.0,peft=0.13.2"])
    out = capsys.readouterr().out
    assert code == 0
    section = out.split("1. lora-requires-grad", 1)[1].split("\n2. ", 1)[0]
    assert "workarounds expected to hold on your versions" in section
    for fix in ("orig=1", "wrap=peft_policy", "wrap=fsdp2"):
        assert fix in section


def test_nearest_combo_without_records():
    assert nearest_combo(MATRIX, {"peft": "0.13.2", "torch": "2.13.0"}).pins.peft == "0.13.2"
    assert nearest_combo(MATRIX, {}) is None


def test_platform_signatures_are_used_when_the_matrix_has_them():
    # the platform section is being added in parallel: any rule object with error/versions/skip/source will do
    err = types.SimpleNamespace(type="AttributeError", match="has no attribute 'record_event'", module=None)
    rule = types.SimpleNamespace(error=err, versions={"torch": "<2.7"}, skip="FSDP2 has no CPU path", source="obs")
    fake = types.SimpleNamespace(cases=MATRIX.cases, combos=MATRIX.combos, platform=[rule])
    paste = parse("AttributeError: 'Stream' object has no attribute 'record_event'\n")
    hits = platform_hits(fake, paste)
    assert [h.signature.where for h in hits] == ["platform[0]"]
    if getattr(MATRIX, "platform", None) is None:
        assert platform_hits(MATRIX, paste) == []
    text, matched = triage_cli.render(fake, paste, {"torch": "2.6.0"}, "given", [])
    assert "platform platform[0] (torch <2.7): FSDP2 has no CPU path" in text
    assert matched == 1 and "it fits a platform rule" in text


@pytest.mark.parametrize("bad", ["torch", "torchx=2.4", "peft="])
def test_bad_versions_is_one_line_and_exit_2(bad, capsys):
    code = cli.main(["triage", str(FIXTURES / "peft1702_title.txt"), "--versions", bad])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and "--versions" in err


def test_missing_file_is_one_line(tmp_path, capsys):
    assert cli.main(["triage", str(tmp_path / "nope.txt")]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_stdin(monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", __import__("io").StringIO(paste_of("peft2167_pix2struct.txt")))
    assert triage_cli.main(["-", "--versions", "peft=0.21.2"]) == 0
    out = capsys.readouterr().out
    assert "1. no-split-modules" in out and "yours are not" in out


def test_fixtures_name_their_source():
    for path in FIXTURES.glob("*.txt"):
        head = path.read_text().splitlines()[0]
        assert head.startswith("# "), path.name
        if not path.name.startswith(("variant_", "records_", "unrelated_")):
            assert "https://github.com/" in head, path.name
    assert json.dumps(EXPECTED)  # the table itself is plain data


@pytest.mark.parametrize(
    "versions,where", [("peft=0.13.2,torch=2.13.0", "on your versions"), ("peft=0.13.1,torch=2.13.0", "on combo old")]
)
def test_workarounds_observed_on_your_versions_else_the_nearest_combo(tmp_path, capsys, versions, where):
    rec = _record("lora-requires-grad", "lora-fp32-orig1-decoder_layer-llama-ws2", "fix-holds", "0.13.2", "old", rule=6)
    append(tmp_path, rec)
    paste = str(FIXTURES / "peft1702_title.txt")
    assert triage_cli.main([paste, "--results", str(tmp_path), "--versions", versions]) == 0
    section = capsys.readouterr().out.split("1. lora-requires-grad", 1)[1].split("\n2. ", 1)[0]
    assert f"observed {where}: fix-holds 1/1 (records)" in section


def test_a_huge_log_is_read_by_its_head_and_tail(tmp_path, capsys, monkeypatch):
    # a whole log of many ranks: the error at its end is found, and no more than MAX_BYTES are kept
    tail = paste_of("llamafactory3550_dora_rank0.txt")
    log = "".join(f"[rank{i % 8}]: step {i} loss 1.0\n" for i in range(300_000)) + tail
    path = tmp_path / "log.txt"
    path.write_text(log)
    assert path.stat().st_size > 3 * MAX_BYTES
    assert len(triage_cli._read(str(path)).encode()) <= MAX_BYTES
    assert triage_cli.main([str(path), "--versions", "peft=0.13.2"]) == 0
    assert "1. dora-sharded-weight" in capsys.readouterr().out
    monkeypatch.setattr("sys.stdin", __import__("io").StringIO(log))
    assert triage_cli.main(["-", "--versions", "peft=0.13.2"]) == 0
    assert "1. dora-sharded-weight" in capsys.readouterr().out


@pytest.mark.parametrize("how", ["utf-16", "nul"])
def test_a_utf16_or_nul_paste_is_matched_and_nothing_of_it_reaches_the_terminal_raw(tmp_path, capsys, how):
    """PowerShell's ``>`` writes UTF-16 with a BOM; a NUL inside a message is whitespace; an escape sequence of the
    paste is never printed."""
    text = paste_of("peft1702_title.txt")
    path = tmp_path / "paste.txt"
    if how == "utf-16":
        path.write_bytes(("\x1b]0;PWNED\x07" + text).encode("utf-16"))
    else:
        path.write_bytes(text.replace("requires_grad", "requires_grad\x00", 1).encode() + b"\x1b]0;PWNED\x07\n")
    assert triage_cli.main([str(path), "--versions", "peft=0.13.2,torch=2.13.0"]) == 0
    out = capsys.readouterr().out
    assert "1. lora-requires-grad" in out and "\x1b" not in out and "\x07" not in out and "PWNED" not in out


@pytest.mark.timeout(120)
def test_an_endless_paste_is_read_up_to_a_bound_and_the_cut_is_said(capsys):
    """``triage /dev/zero`` (or ``- < /dev/zero``) read until a MemoryError; reading only head and tail, it would
    never end: the stream is read up to ``MAX_READ``, then the cut is said in one line."""

    class Endless:
        def __init__(self) -> None:
            self.given = 0

        def read(self, size: int = -1) -> bytes:
            size = size if size > 0 else 1 << 20
            self.given += size
            return b"\0" * size

    stream = Endless()
    text = triage_cli._head_and_tail(stream)
    assert len(text) <= MAX_BYTES and stream.given <= triage_cli.MAX_READ + MAX_BYTES
    err = capsys.readouterr().err.strip()
    assert "read its first" in err and len(err.splitlines()) == 1, err


@pytest.mark.timeout(40)
def test_defect14_triage_searches_within_one_time_budget_and_says_what_it_skipped(tmp_path, monkeypatch, capsys):
    """A rule regex the probes miss cost 2 s per search, with one 'timed out' line each: 5 tracebacks took 45 s
    (9 lines), 40 took 257 s. Now a rule is not searched again after its first timeout, every search shares one
    budget, and one line says what was skipped."""
    from fsdp_matrix import patterns
    from tests.helpers import matrix_data, write_matrix

    monkeypatch.setattr(patterns, "check", lambda pattern: None)  # a regex the probes do not catch
    data = matrix_data()
    data["cases"][0]["expect"].insert(0, {"error": {"type": "RuntimeError", "match": "(b|bb)+$"}, "source": "s"})
    matrix = write_matrix(tmp_path, data)
    paste = "".join(
        f'Traceback (most recent call last):\n  File "x.py", line {i}, in f\nRuntimeError: {"b" * (40 + i)}!\n'
        for i in range(40)
    )
    (tmp_path / "paste.txt").write_text(paste)
    triage_cli.main([str(tmp_path / "paste.txt"), "--matrix", str(matrix), "--versions", "torch=2.13.0,peft=0.21.2"])
    err = [line for line in capsys.readouterr().err.splitlines() if "regex" in line]
    assert len(err) == 1 and "timed out" in err[0] and "not searched again" in err[0], err


@pytest.mark.timeout(120)
def test_dev_zero_is_one_line_not_two_contradictory_ones(capsys):
    """``triage /dev/zero`` said 'the paste is larger than 64 MiB: read its first 64 MiB only', then 'the paste is
    empty'."""
    assert cli.main(["triage", "/dev/zero", "--versions", "torch=2.13.0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "64 MiB" in err[0] and "no text" in err[0], err


def test_two_tracebacks_each_claim_cites_only_frames_of_the_traceback_that_matched():
    """A paste of transformers#27542's FlatParameter traceback and llamafactory#3550's DoRA one: lora-requires-grad's
    evidence cited 'PEFT: frame in peft.tuners.lora.dora', a frame of the other traceback."""
    text = paste_of("transformers27542_flatparameter.txt") + paste_of("llamafactory3550_dora_rank0.txt")
    found = {m.case.id: m for m in claims(match(MATRIX, parse(text)))}
    requires_grad = " ".join(found["lora-requires-grad"].hits[0].evidence)
    assert "dora" not in requires_grad and "message: exact" in requires_grad, requires_grad
    assert "frame in peft.tuners.lora.dora" in " ".join(found["dora-sharded-weight"].hits[0].evidence)
