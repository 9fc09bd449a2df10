"""``triage.parse``: a paste is read within a bounded size, its repeated lines once, and each exception line keeps
the frame printed above it."""

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
