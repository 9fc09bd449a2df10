"""``triage.parse``: a paste is read within a bounded size, its repeated lines once, and each exception line keeps
the frame printed above it."""

from fsdp_matrix.triage import parse as parse_module
from fsdp_matrix.triage.parse import MAX_BYTES, bounded, parse

FRAME = '  File "/x/site-packages/torch/distributed/fsdp/_flat_param.py", line 770, in _validate_tensors_to_flatten\n'
ERROR = "ValueError: Cannot flatten integer dtype tensors\n"


def test_a_huge_paste_is_cut_to_its_head_and_tail_and_keeps_the_error():
    noise = "".join(f"[rank{i % 8}]: step {i} loss 1.0\n" for i in range(400_000))  # ~10 MB of log
    text = FRAME + "    raise ValueError(\n" + noise + FRAME + "    raise ValueError(\n" + ERROR
    assert len(text.encode()) > 4 * MAX_BYTES
    assert len(bounded(text).encode()) <= MAX_BYTES + 1
    paste = parse(text)
    assert [e.message for e in paste.errors] == ["Cannot flatten integer dtype tensors"]
    assert paste.errors[0].raised_in.module == "torch.distributed.fsdp._flat_param"


def test_every_rank_s_copy_of_a_line_is_read_once_blank_lines_kept():
    ranks = "".join(f"[rank{r}]: {FRAME}[rank{r}]: {ERROR}" for r in range(64))
    paste = parse(ranks + "\n\n" + ranks)
    assert paste.lines.count(FRAME.strip()) == 1 and paste.lines.count(ERROR.strip()) == 1
    assert len(paste.frames) == 1 and len(paste.errors) == 1
    assert paste.errors[0].raised_in == paste.frames[0]


def test_the_frame_above_an_exception_is_its_raise_site_not_a_frame_far_away():
    near = parse(FRAME + "    raise ValueError(\n" + ERROR)
    far = parse(FRAME + "\n".join(f"log line {i}" for i in range(10)) + "\n" + ERROR)
    assert near.errors[0].raised_in is not None
    assert far.errors[0].raised_in is None


def test_no_terminal_control_sequence_of_the_paste_survives():
    """A paste's OSC title and hyperlink sequences, bells and backspaces would act on the reader's terminal when the
    pasted error is printed: every control character but tab and newline goes, an OSC's payload with it."""
    hostile = (
        "RuntimeError: boom\x1b]0;PWNED-TITLE\x07 \x1b]8;;http://evil.invalid\x1b\\here\x1b]8;;\x1b\\ x\x08y"
        "\x1b]52;c;Y2xpcGJvYXJk\x07 \x1b[31mred\x1b[0m \x9b2J end\x7f\n"
    )
    paste = parse(hostile)
    [err] = paste.errors
    shown = err.message + paste.text + "".join(paste.lines)
    assert not any(ord(c) < 32 or 0x7F <= ord(c) < 0xA0 for c in shown), repr(shown)
    assert "PWNED" not in shown and "evil.invalid" not in shown and "Y2xpcGJvYXJk" not in shown
    assert err.message == "boom here xy red end"  # \x9b2J is a C1 CSI (erase the screen), 2J its arguments


def test_a_nul_inside_a_message_reads_as_whitespace():
    [err] = parse("ValueError: Attempting to unscale\x00FP16 gradients.\n").errors
    assert err.message == "Attempting to unscale FP16 gradients."


def test_a_paste_saved_as_utf16_or_with_a_bom_is_decoded_by_its_bom():
    text = "Traceback (most recent call last):\r\n" + FRAME + ERROR
    for encoding in ("utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-8-sig"):
        bom = {"utf-16-le": "\ufeff", "utf-16-be": "\ufeff"}.get(encoding, "")
        data = (bom + text).encode(encoding)
        assert [e.message for e in parse(parse_module.decode(data)).errors] == [
            "Cannot flatten integer dtype tensors"
        ], encoding
    assert parse_module.decode("plain ascii \xff".encode("latin-1")) == "plain ascii \ufffd"


def test_a_log_of_many_distinct_errors_keeps_the_first_and_the_last_and_counts_the_rest():
    """40k distinct exception lines took 291 s to triage: every one was matched against every rule. The first and
    the last ``MAX_ERRORS / 2`` are kept (where a run's first failure and its final exception are); the rest are
    counted, and triage says so."""
    text = "".join(f"ValueError: distinct message number {i}\n" for i in range(40_000))
    paste = parse(text)
    kept = [e.message for e in paste.errors]
    half = parse_module.MAX_ERRORS // 2
    assert len(kept) == parse_module.MAX_ERRORS and paste.errors_left_out == 40_000 - parse_module.MAX_ERRORS
    assert kept[0] == "distinct message number 0" and kept[-1] == "distinct message number 39999"
    assert kept[half - 1] == f"distinct message number {half - 1}"
    assert kept[half] == f"distinct message number {40_000 - half}"


RICH = """\
╭─────────────────────────────── Traceback (most recent call last) ────────────────────────────────╮
│ /root/miniconda3/envs/x/lib/python3.10/site-packages/torch/nn/modules/m │
│ odule.py:1818 in state_dict                                                    │
│                                                                                │
│ ❱ 1818 │   │   │   │   module.state_dict(destination=destination, prefix=prefi │
│                                                                                │
│ /usr/lib/python3/dist-packages/peft/tuners/lora/dora.py:7 │
│ 2 in forward                                                                   │
╰────────────────────────────────────────────────────────────────────────────────╯
IndexError: tuple index out of range
"""


def test_a_rich_traceback_s_frames_are_read_through_its_box_and_its_wraps():
    paste = parse("\x1b[31m" + RICH.replace("IndexError", "\x1b[1mIndexError\x1b[0m"))
    assert [(f.module, f.function) for f in paste.frames] == [
        ("torch.nn.modules.module", "state_dict"),
        ("peft.tuners.lora.dora", "forward"),
    ]
    assert [(e.short_type, e.message) for e in paste.errors] == [("IndexError", "tuple index out of range")]
    assert paste.errors[0].frames == tuple(paste.frames)


def test_a_frame_line_wrapped_by_the_terminal_is_read_whole():
    """A terminal or an issue's width wraps a long ``File "..."`` line inside its path or before its function, and a
    raise statement's source line too: the frame is still read with its module and function, and it is still the raise
    site (its module is what tells a verl or accelerate raise apart from the rule's)."""
    wrapped = (
        '  File "/home/u/miniconda3/envs/t/lib/python3.10/site-pack\n'
        'ages/accelerate/utils/dataclasses.py", line 1818, in\n'
        "set_auto_wrap_policy\n"
        '    raise Exception("Could not find the transformer layer class to wrap in the\n'
        'model.")\n'
        "Exception: Could not find the transformer layer class to wrap in the model.\n"
    )
    paste = parse(wrapped)
    assert [(f.module, f.function) for f in paste.frames] == [("accelerate.utils.dataclasses", "set_auto_wrap_policy")]
    assert paste.errors[0].raised_in == paste.frames[0]


def test_a_frame_line_is_not_joined_to_the_source_line_below_it():
    paste = parse('  File "/x/site-packages/peft/peft_model.py", line 3\n    model.generate()\nValueError: boom\n')
    assert [f.path for f in paste.frames] == ["/x/site-packages/peft/peft_model.py"]


def test_a_log_s_line_prefixes_are_not_part_of_a_wrapped_message():
    """Ray's actors (verl, OpenRLHF) prefix each line with ``(WorkerDict pid=N, ip=...)``, loggers and CI with a
    timestamp and a level, srun -l and pdsh with a task or host: a message wrapped over two lines reads as one
    message, without the second line's prefix. A bracketed timestamp (DeepSpeed's records) starts a new record: it is
    never read as the message's next line."""
    message = "Must flatten tensors with uniform dtype but got torch.float32 and torch.bfloat16"
    head, tail = message[:40], message[40:]
    for prefix in (
        "(WorkerDict pid=1234, ip=10.0.0.7) ",
        "(RayTrainWorker pid=88) ",
        "2024-05-01 12:00:00,123 - root - ERROR - ",
        "2024-05-01 12:00:00 [ERROR] [engine.py:12:train] ",
        "2024-05-01T12:00:00.1234567Z ",
        "0: ",
        "worker-1: ",
    ):
        paste = parse(f"{prefix}ValueError: {head}\n{prefix}{tail}\n")
        assert [e.message for e in paste.errors] == [message], prefix
        framed = parse(f'{prefix}  File "/x/site-packages/torch/distributed/fsdp/_flat_param.py", line 7, in f\n')
        assert framed.lines == ['File "/x/site-packages/torch/distributed/fsdp/_flat_param.py", line 7, in f']
    record = parse(f"ValueError: {message}\n[2024-05-01 12:00:01,000] [ERROR] [launch.py:3:main] exiting\n")
    assert [e.message for e in record.errors] == [message]


def test_a_paste_copied_from_a_web_page_is_read_as_text():
    """A paste from a page's HTML or a chat keeps its entities (``&#39;``, ``&gt;``) and zero-width or soft-hyphen
    characters inside words: they are read as the characters they stand for, or as nothing."""
    paste = parse("AttributeError: &#39;Params4bit&#39; object has no\u200b attri\u00adbute &#x27;absmax&#x27;\n")
    assert [e.message for e in paste.errors] == ["'Params4bit' object has no attribute 'absmax'"]


def test_typographic_quotes_read_as_the_quotes_python_prints():
    """A forum, a chat or a word processor turns ``'absmax'`` into ``‘absmax’``: a message's quotes are read as
    Python printed them."""
    paste = parse("AttributeError: \u2018Params4bit\u2019 object has no attribute \u201cabsmax\u201d\n")
    assert [e.message for e in paste.errors] == ["'Params4bit' object has no attribute \"absmax\""]


RICH_RAISE = """\
╭───────────────────── Traceback (most recent call last) ─────────────────────╮
│ /home/u/verl/verl/workers/fsdp_workers.py:499 in _build_model_optimizer      │
│                                                                              │
│   498 │   │   auto_wrap_policy = get_fsdp_wrap_policy(                       │
│ ❱ 499 │   │   │   module=actor_module,                                       │
│   500 │   │   │   config=fsdp_config.get("wrap_policy", None),               │
│                                                                              │
│ /home/u/verl/verl/utils/fsdp_utils.py:128 in get_fsdp_wrap_policy            │
│                                                                              │
│   125 │   │   │   if transformer_cls is None:                                │
│   126 │   │   │   │   raise Exception(                                       │
│   127 │   │   │   │   │   "Could not find the transformer layer class"       │
│ ❱ 128 │   │   │   │   )                                                      │
│   129 │   │   │   transformer_cls_to_wrap.add(transformer_cls)               │
│   130 │                                                                      │
╰──────────────────────────────────────────────────────────────────────────────╯
Exception: Could not find the transformer layer class to wrap in the model.
"""


def test_a_rich_traceback_s_last_frame_is_the_raise_site():
    """rich prints a few lines of source around each frame and closes its box before the exception line: its last
    frame is still the raise site (verl's own check, not the rule's), as in Python's traceback."""
    paste = parse(RICH_RAISE)
    assert [f.function for f in paste.frames] == ["_build_model_optimizer", "get_fsdp_wrap_policy"]
    assert paste.errors[0].raised_in == paste.frames[-1]
    # the source it shows is still the paste's text
    assert "get_fsdp_wrap_policy(" in paste.text


def test_a_rich_traceback_in_ascii_boxes_or_garbled_is_read_alike():
    """rich draws its boxes in ASCII on a console that cannot print box characters (``+---+``, ``| ... |``), and a
    paste read in the wrong encoding turns them into ``â”‚``: the frames and raise site read as from the box."""
    whole = parse(RICH_RAISE)
    ascii_box = RICH_RAISE.translate(str.maketrans("╭╮╰╯─│❱", "++++-|>"))
    garbled = RICH_RAISE.encode("utf-8").decode("cp1252", "replace")
    for text in (ascii_box, garbled):
        paste = parse(text)
        assert [(f.module, f.path, f.function) for f in paste.frames] == [
            (f.module, f.path, f.function) for f in whole.frames
        ]
        assert paste.errors[0].raised_in == paste.frames[-1]


def test_a_rich_frame_header_wrapped_inside_its_function_s_name_is_read_whole():
    """rich fills each row of its box to the width and goes on in the next, inside any word: ``... in _load_p`` /
    ``retrained_model``, ``...py:563 i`` / ``n from_pretrained``."""
    box = (
        "╭──────────────────── Traceback (most recent call last) ────────────────────╮\n"
        "│ /x/site-packages/transformers/models/auto/auto_factory.py:563 i │\n"
        "│ n from_pretrained                                                   │\n"
        "│                                                                     │\n"
        "│ ❱ 563 │   return model_class.from_pretrained(                         │\n"
        "│                                                                     │\n"
        "│ /x/site-packages/transformers/modeling_utils.py:4104 in _load_p │\n"
        "│ retrained_model                                                     │\n"
        "│                                                                     │\n"
        "│ ❱ 4104 │   raise                                                        │\n"
        "╰─────────────────────────────────────────────────────────────────────╯\n"
        "RuntimeError: boom\n"
    )
    paste = parse(box)
    assert [f.function for f in paste.frames] == ["from_pretrained", "_load_pretrained_model"]
    assert paste.errors[0].raised_in == paste.frames[-1]


def test_a_traceback_logged_as_an_escaped_string_is_read_as_printed():
    """A structured log, a JSON record or a repr() keeps a traceback on one line, its newlines and quotes escaped
    (``'Traceback (most recent call last):\\n  File \\"/x.py\\", ...'``): it is read as Python printed it."""
    printed = FRAME + "    raise ValueError(\n" + ERROR
    logged = (
        '{"level": "error", "exc": "Traceback (most recent call last):\\n'
        + printed.replace('"', '\\"').replace("\n", "\\n")
        + '"}\n'
    )
    paste = parse(logged)
    assert [e.message for e in paste.errors] == ["Cannot flatten integer dtype tensors"]
    assert paste.errors[0].raised_in.module == "torch.distributed.fsdp._flat_param"
    # a message that merely mentions a backslash-n is not unescaped
    assert parse("ValueError: use '\\n' as the separator\n").errors[0].message == "use '\\n' as the separator"


def test_a_rich_frame_with_a_relative_path_and_a_frame_line_wrapped_after_file_are_read():
    """rich prints a frame's file as Python has it, relative when imported from the working directory
    (``src/train.py``); a terminal may wrap a ``File "..."`` line right after ``File``."""
    boxed = parse("╭─── Traceback ───╮\n│ src/pkg/train.py:12 in main │\n╰─────╯\nValueError: boom\n")
    assert [(f.path, f.function) for f in boxed.frames] == [("src/pkg/train.py", "main")]
    wrapped = parse('  File\n"/x/site-packages/peft/peft_model.py", line 3, in forward\nValueError: boom\n')
    assert [(f.module, f.function) for f in wrapped.frames] == [("peft.peft_model", "forward")]


def test_a_traceback_cut_before_its_exception_does_not_lend_its_frames_to_the_next_one():
    """Two failures in one paste: the first quoted as a title above its traceback, which the paste cuts before its
    exception line, then a second exception. Python prints no blank line inside a traceback: the first one's frames
    are not the second exception's own (its rule is judged by its own frames, or by the whole paste's)."""
    text = (
        "ValueError: Cannot flatten integer dtype tensors\n\n"
        "Traceback (most recent call last):\n" + FRAME + "    result = tuple(\n\n"
        "and in another run:\n"
        "RuntimeError: 'weight' must be 2-D\n"
    )
    paste = parse(text)
    assert [e.frames for e in paste.errors] == [(), ()]
    # a traceback whose last frame stands right above its exception line keeps its frames
    assert parse(FRAME + "    raise ValueError(\n" + ERROR).errors[0].frames == tuple(parse(FRAME).frames)
