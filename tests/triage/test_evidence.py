"""``triage.evidence``: what a paste shows besides its message."""

import pytest

from fsdp_matrix.triage.evidence import adapter_kinds, adapters_named, from_pretrained_init, read_context
from fsdp_matrix.triage.parse import parse


@pytest.mark.parametrize(
    "text,peft",
    [
        ("PEFT version: 0.15.0\nDeepSpeed version: 0.15.4\n", False),  # an environment listing, no adapter
        ("peft==0.3.0\n", False),
        ("FSDP2训练LoRA报错\n", True),  # CJK around LoRA: still the word
        ("model = get_peft_model(model, config)\n", True),
        ("self._is_lora = True\n", False),
    ],
)
def test_peft_evidence_is_an_adapter_not_an_installed_package(text, peft):
    assert bool(read_context(parse(text)).peft) is peft


@pytest.mark.parametrize(
    "text,elsewhere",
    [
        ("DeepSpeed ZeRO-3 throws RuntimeError\n", ["deepspeed"]),
        ("- DeepSpeed version: 0.15.4\n- Accelerate version: 1.5.2\n", []),
        ("when using LoRA + fsdp2 Context Parallel\n", ["context-parallel"]),
        ('  File "/x/site-packages/megatron/core/optimizer.py", line 3, in step\n', ["megatron"]),
        # a stack the report says it did not use is not that stack
        ("LoRA training without deepspeed under FSDP fails\n", []),
        ("When not using DeepSpeed, I get the following error\n", []),
        ("FSDP instead of DeepSpeed, and then\n", []),
        ("it is not DeepSpeed, it is FSDP\n", []),
        ("no deepspeed here, but later we ran deepspeed zero3\n", ["deepspeed"]),
        # a list of modules that names FSDP too (verl's pull-request template) names no stack that ran
        ("{modules} include fsdp,megatron,sglang,vllm,rollout\n", []),
        ("[fsdp, megatron] feat: dynamic batching\n", []),
        ("we train with megatron, sglang, vllm\n", ["megatron"]),
        ("trained with Megatron-LM; fsdp was slower\n", ["megatron"]),
    ],
)
def test_other_stacks_are_read_from_words_and_frames(text, elsewhere):
    assert [name for name, _ in read_context(parse(text)).elsewhere] == elsewhere


def test_a_model_s_own_init_under_from_pretrained():
    text = (
        '  File "/x/site-packages/transformers/modeling_utils.py", line 3, in from_pretrained\n'
        "    model = cls(config)\n"
        '  File "/x/site-packages/transformers/models/llama/modeling_llama.py", line 9, in __init__\n'
        "    self.scale = x.item()\n"
        "RuntimeError: Tensor.item() cannot be called on meta tensors\n"
    )
    assert from_pretrained_init(parse(text)) == "transformers.models.llama.modeling_llama"
    assert from_pretrained_init(parse(text.replace("in from_pretrained", "in resize_token_embeddings"))) is None


def test_a_report_that_never_shows_fsdp_is_not_claimed_even_on_an_exact_message():
    """peft#1720's kind: a QLoRA error in a single-GPU notebook, with versions and a description but no FSDP."""
    from pathlib import Path

    from fsdp_matrix.matrix import load_matrix
    from fsdp_matrix.triage.match import claims, match

    matrix = load_matrix(Path(__file__).resolve().parents[2] / "matrix.yaml", check_repros=False)
    message = "RuntimeError: only Tensors of floating point dtype can require gradients\n"
    report = "We fine-tune a DistilBERT classifier with QLoRA in a notebook on one GPU, with transformers 4.40.1, "
    report += "peft 0.10.0, accelerate 0.30.0 and bitsandbytes 0.43.1, and the trainer fails at once:\n"
    assert claims(match(matrix, parse(report + message))) == []
    assert claims(match(matrix, parse(report.replace("on one GPU", "under FSDP on two GPUs") + message)))


def test_an_exact_message_whose_traceback_runs_in_another_sharding_library_is_not_claimed():
    from pathlib import Path

    from fsdp_matrix.matrix import load_matrix
    from fsdp_matrix.triage.match import claims, match

    matrix = load_matrix(Path(__file__).resolve().parents[2] / "matrix.yaml", check_repros=False)
    frames = (
        '  File "/x/site-packages/peft/tuners/lora/model.py", line 3, in forward\n'
        '  File "/x/site-packages/fairscale/nn/data_parallel/fully_sharded_data_parallel.py", line 9, in _lazy_init\n'
    )
    # log lines between the traceback and its exception line: the frame above it is not its raise site
    message = "\n".join(f"rank{i}: step failed" for i in range(4))
    message += (
        "\nAssertionError: FSDP expects uniform original parameter dtype but got {torch.bfloat16, torch.float32}\n"
    )
    assert claims(match(matrix, parse(frames + message))) == []
    torch_frame = '  File "/x/site-packages/torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py", line 9, in f\n'
    assert claims(match(matrix, parse(frames.replace(frames.splitlines()[1], torch_frame.rstrip()) + message)))


@pytest.mark.parametrize(
    "text,full",
    [
        ("We continue pretraining the whole model (full fine-tuning, no adapters)\n", True),
        ("finetuning_type: full\n", True),
        ("train with full_params and the optimizer over every weight\n", True),
        # an API's name that holds the words is not the run's setting (FSDP1's summon_full_params)
        ("the fix calls FullyShardedDataParallel.summon_full_params() around the weight access\n", False),
        ("state_dict_type: FULL_STATE_DICT with fully_shard\n", False),
        # FSDP gathering the full parameters of its shards (summon, gather, unshard) is not training them all
        ("Uses FSDP.summon_full_params() to gather full parameters when needed\n", False),
        ("adds some basic fixes such as summoning full params before merging the lora adapters\n", False),
        ("we unshard the full parameters, then full parameter fine-tuning follows\n", True),
    ],
)
def test_full_fine_tuning_is_read_from_words_not_from_an_api_name(text, full):
    assert read_context(parse(text)).full_finetune is full


def test_a_message_raised_while_from_pretrained_loads_the_model_is_not_an_fsdp_case_s():
    """The rule's error with a traceback inside transformers' from_pretrained, no frame of FSDP or of the rule's
    module: it is raised while loading, before anything is wrapped."""
    from pathlib import Path

    from fsdp_matrix.matrix import load_matrix
    from fsdp_matrix.triage.match import claims, match

    matrix = load_matrix(Path(__file__).resolve().parents[2] / "matrix.yaml", check_repros=False)
    head = "fsdp + qlora on 8 GPUs: RuntimeError: only Tensors of floating point dtype can require gradients\n\n"
    frames = (
        '  File "/x/site-packages/transformers/modeling_utils.py", line 3, in from_pretrained\n'
        "    model = cls._load_pretrained_model(\n"
        '  File "/x/site-packages/bitsandbytes/nn/modules.py", line 9, in __new__\n'
        "    self = torch.Tensor._make_subclass(cls, data, requires_grad)\n"
    )
    assert claims(match(matrix, parse(head + frames))) == []
    wrapping = '  File "/x/site-packages/torch/distributed/fsdp/_fully_shard/_fully_shard.py", line 9, in fully_shard\n'
    assert claims(match(matrix, parse(head + frames.replace("in from_pretrained", "in load") + wrapping)))


@pytest.mark.parametrize(
    "text,peft",
    [
        ("FSDP full state dict of a model whose Linear4bit layers hold Params4bit weights\n", True),
        ("model loaded with load_in_4bit=True, bnb_4bit_quant_type='nf4', under FSDP\n", True),
        ("bitsandbytes 0.45.0 installed; FSDP full fine-tuning in bf16\n", False),
    ],
)
def test_a_4bit_base_is_trained_through_adapters(text, peft):
    assert bool(read_context(parse(text)).peft) is peft


@pytest.mark.parametrize(
    "text,kinds",
    [
        ("SFTTrainer with use_dora=True under FSDP\n", {"dora", "qdora"}),
        ("QDoRA on a 4-bit base\n", {"dora", "qdora"}),
        ("prompt tuning under FSDP1\n", {"prompt"}),
        ("LoRA on the experts with target_parameters\n", {"lora_params"}),
        ("LoRA under FSDP, the adapter's dropout\n", set()),
        ("DoRAemon_config = 1\n", set()),
    ],
)
def test_the_adapter_kinds_a_paste_names(text, kinds):
    assert adapters_named(parse(text).text) == kinds


@pytest.mark.parametrize(
    "text,kinds",
    [
        ("LoRA on the MoE experts under FSDP\n", {"lora", "qlora", "lora_params"}),
        ("DoRA under FSDP (LoRA with use_dora)\n", {"dora", "qdora"}),
        ("a full fine-tune under FSDP\n", set()),
    ],
)
def test_the_adapter_a_paste_s_words_allow(text, kinds):
    assert adapter_kinds(parse(text).text) == kinds


@pytest.mark.parametrize(
    "text,peft",
    [
        # the user's own script named for its adapter: the run trains one
        ('  File "run_clm_pt_with_peft.py", line 610, in main\n', True),
        ("torchrun --nproc_per_node 2 finetune_lora.py --model x\n", True),
        ("python train-qlora.py\n", True),
        # a library's file, or a library's helper named in a frame's code line, is not the run's adapter
        ('  File "/x/site-packages/transformers/trainer.py", line 3, in train\n    if _is_peft_model(m):\n', False),
        ('  File "/x/site-packages/mylib/lora_utils.py", line 3, in f\n', False),
        ("python train_explorer.py\n", False),
    ],
)
def test_a_script_named_for_its_adapter_shows_one(text, peft):
    assert bool(read_context(parse(text)).peft) is peft


CHECKPOINTED = (
    "LoRA on flan-t5 with Seq2SeqTrainer and gradient checkpointing on one GPU; the loss never goes backward and the"
    " trainer stops at the first step:\n"
    "RuntimeError: element 0 of tensors does not require grad and does not have a grad_fn\n"
)


def test_a_case_whose_title_names_no_fsdp_is_claimed_from_its_message_without_fsdp():
    """gc-frozen-inputs' failure is reentrant checkpointing over frozen inputs, with or without FSDP (its title names
    none): its exact message in a report without FSDP, or under DeepSpeed ZeRO-2, was listed as similar, unclaimed."""
    from pathlib import Path

    from fsdp_matrix.matrix import load_matrix
    from fsdp_matrix.triage.match import claims, match

    matrix = load_matrix(Path(__file__).resolve().parents[2] / "matrix.yaml", check_repros=False)
    found = claims(match(matrix, parse(CHECKPOINTED)))
    assert found and found[0].case.id == "gc-frozen-inputs" and found[0].level != "strong"
    zero2 = CHECKPOINTED.replace("on one GPU", "under DeepSpeed ZeRO-2")
    assert claims(match(matrix, parse(zero2)))[0].case.id == "gc-frozen-inputs"
    # with no adapter shown, the same message is a frozen model's, not PEFT's: still unclaimed
    assert not claims(match(matrix, parse(CHECKPOINTED.replace("LoRA on ", ""))))


def test_a_traceback_that_runs_in_colossalai_is_not_claimed():
    """ColossalAI's booster is another sharding library: its pipeline's backward is not the case's code path."""
    from pathlib import Path

    from fsdp_matrix.matrix import load_matrix
    from fsdp_matrix.triage.match import claims, match

    matrix = load_matrix(Path(__file__).resolve().parents[2] / "matrix.yaml", check_repros=False)
    frame = '  File "/x/site-packages/{}.py", line 9, in execute_pipeline\n'
    message = "RuntimeError: element 0 of tensors does not require grad and does not have a grad_fn\n"
    head = "LoRA fine-tuning fails at the first step:\nTraceback (most recent call last):\n"
    assert not claims(match(matrix, parse(head + frame.format("colossalai/booster/booster") + message)))
    assert claims(match(matrix, parse(head + frame.format("torch/autograd/__init__") + message)))
    # the message in a title above a traceback cut before its exception line: the traceback is still colossalai's
    title = "[BUG]: " + message + "\nWhen I fine-tune with lora_finetune.py:\nTraceback (most recent call last):\n"
    assert not claims(match(matrix, parse(title + frame.format("colossalai/booster/booster"))))


def test_uint8_storage_is_a_quantized_base_trained_through_adapters():
    """bitsandbytes stores a 4-bit base as uint8: like Params4bit, it shows the run trains adapters; int8 does not (an
    8-bit model is trained whole too)."""
    assert read_context(parse("fully_shard on the model's uint8 weights crashes\n")).peft
    assert not read_context(parse("load_in_8bit model with int8 weights, trained whole\n")).peft


def test_two_cases_alike_in_a_report_that_shows_no_adapter_are_not_claimed():
    """FSDP1's uniform-dtype message with two floating dtypes fits mixed-dtype and trl-qlora-upcast alike; in a report
    that never shows an adapter (an SDXL model whose two UNets have two dtypes) it was claimed weak."""
    from pathlib import Path

    from fsdp_matrix.matrix import load_matrix
    from fsdp_matrix.triage.match import claims, match

    matrix = load_matrix(Path(__file__).resolve().parents[2] / "matrix.yaml", check_repros=False)
    report = (
        "ValueError: `FlatParameter` requires uniform dtype but got torch.bfloat16 and torch.float32\n\n"
        "When training SDXL with fsdp, accelerator.prepare raises it: I think one UNet is fp16 and the other float32,"
        " but it may be the package version\n"
    )
    found = match(matrix, parse(report))
    assert not claims(found) and "nothing in the paste shows a PEFT adapter" in (found[0].against or "")
    assert claims(match(matrix, parse(report.replace("training SDXL", "training SDXL LoRA"))))


STRAY = (
    "Exception: Could not find the transformer layer class to wrap in the model.\n\n"
    "Did you enable fsdp by any chance? It looks like fsdp is enabled, but not configured: is there a default config"
    " file left on your system from another project? Delete it please.\n\nYes, it works now: there was such a file from"
    " my other project, which I deleted. Thanks again for pointing me in the right direction.\n"
)


def test_a_weak_claim_in_a_report_that_shows_no_adapter_is_not_made():
    """A case's message, pasted under another class, in a thread about a stray accelerate config that never shows an
    adapter, was claimed weak; a title that quotes the message beside an environment listing is no such report."""
    from pathlib import Path

    from fsdp_matrix.matrix import load_matrix
    from fsdp_matrix.triage.match import claims, match

    matrix = load_matrix(Path(__file__).resolve().parents[2] / "matrix.yaml", check_repros=False)
    found = match(matrix, parse(STRAY))
    assert not claims(found) and "nothing in the paste shows a PEFT adapter" in (found[0].against or "")
    assert claims(match(matrix, parse(STRAY.replace("by any chance", "for your LoRA run"))))
    title = (
        'The FSDP example fails to run with "ValueError: Must flatten tensors with uniform requires_grad when'
        ' use_orig_params=False"\n\n### System Info\n\npytorch version: 2.2.2\npeft version: 0.10.0\nGPUs: 8 A100\n'
    )
    assert claims(match(matrix, parse(title)))
