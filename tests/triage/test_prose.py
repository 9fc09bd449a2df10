"""``triage.prose``: a report in words names a case at weak evidence at most, only when one case is named ahead of
every other and no exception line of the paste is another error. Synthetic reports (no held-out paste)."""

from pathlib import Path

from fsdp_matrix.matrix import load_matrix
from fsdp_matrix.triage import match as match_module
from fsdp_matrix.triage import prose
from fsdp_matrix.triage.match import claims, match
from fsdp_matrix.triage.parse import parse
from fsdp_matrix.triage.prose import held, named, phrases, terms

MATRIX = load_matrix(Path(__file__).resolve().parents[2] / "matrix.yaml", check_repros=False)
TITLES = [(c.id, c.title) for c in MATRIX.cases]


def _first(text):
    found = claims(match(MATRIX, parse(text)))
    return (found[0].case.id, found[0].level) if found else (None, None)


def test_a_title_s_settings_and_entries_are_its_words_the_matrix_s_subject_is_not():
    words = terms("LoRA + FSDP1 use_orig_params=False: frozen and trainable weights in one FSDP unit")
    assert words == {"use_orig_params"}
    assert "generate()" in terms("generate() on a fully_shard-ed PEFT model: the root's parameters stay sharded")


def test_a_report_naming_a_case_s_words_and_its_generic_message_is_claimed_weak():
    text = (
        "With FSDP2 (fully_shard) the base model is already sharded when get_peft_model adds LoRA, and then:\n"
        "RuntimeError: The size of tensor a (1024) must match the size of tensor b (512) at non-singleton dimension 1\n"
    )
    assert _first(text) == ("lora-after-shard", "weak")
    # the same words without FSDP shown are not a claim: every case runs under FSDP
    assert _first(text.replace("With FSDP2 (fully_shard)", "On one GPU")) == (None, None)


def test_words_do_not_name_a_case_over_another_error_or_a_tie():
    other = "FSDP + LoRA, the base model sharded before get_peft_model and merge_and_unload after training:\n"
    assert named(TITLES, other) is None  # one word each for two cases: a tie
    oom = "FSDP LoRA with use_orig_params=False and DoRA, and then:\ntorch.OutOfMemoryError: CUDA out of memory.\n"
    assert _first(oom) == (None, None)


def test_words_alone_never_claim_above_weak():
    text = "FSDP1 with LoRA: use_orig_params=False and the PEFT model's modules_to_save lm_head, DoRA off, no error yet"
    first, level = _first(text)
    assert level in (None, "weak")


def test_a_library_s_name_in_a_frame_s_path_is_not_a_word_of_the_report():
    frames = '  File "/x/site-packages/trl/trainer/sft_trainer.py", line 440, in train\n'
    text = "FSDP + QLoRA runs out of memory on 4 GPUs\n" + frames
    assert named(TITLES, text) is None  # qlora alone: one word
    assert named(TITLES, text + "with TRL's trainer\n") is not None  # the report says trl: two words


def test_a_title_s_dtypes_are_words_in_one_spelling():
    assert {"bfloat16", "float32"} <= terms("FSDP2 unit: bf16 base, fp32 LoRA")
    assert "float32" in terms("fp32-upcast adapters")
    titles = [("a", "FSDP2 unit: bf16 base, fp32 LoRA"), ("b", "FSDP1 NO_SHARD: the flat parameter")]
    assert named(titles, "LoRA loaded in float32 beside a bfloat16 model").case == "a"


def test_an_exception_class_is_a_word_however_the_report_spells_it():
    titles = [("a", "fully_shard unit of a bf16 base AssertionError"), ("b", "fully_shard on a ParameterDict")]
    found = named(titles, "a bf16 base and then an assertion error from fully_shard")
    assert found is not None and found.case == "a" and "assertionerror" in found.words


def test_a_report_names_a_case_by_its_dtypes_and_its_error_s_class():
    text = "PEFT LoRA under FSDP: the bfloat16 base and the float32 adapters end in an assertion error when wrapping\n"
    assert _first(text) == ("fsdp2-mixed-dtype-unit", "weak")
    assert _first(text.replace("an assertion error", "a failure")) == (None, None)  # two cases name both dtypes


def test_words_never_name_a_case_whose_cells_never_run_the_adapter_the_report_names():
    text = "FSDP with TRL's SFTTrainer and DoRA: training fails after the first steps\n"
    assert _first(text) == (None, None)  # SFTTrainer and TRL name fsdp1-mp-optimizer-dtype, which runs no DoRA
    assert _first(text.replace("DoRA", "LoRA")) == ("fsdp1-mp-optimizer-dtype", "weak")


def test_a_title_s_plain_words_are_read_as_pairs_in_one_spelling():
    title = "Reentrant gradient checkpointing turned on after PEFT, with frozen inputs: element 0 does not require grad"
    report = "model.gradient_checkpointing_enable() called after the PeftModel is created: require_grads=True nowhere"
    assert {"gradient checkpoint", "after peft", "require grad"} <= phrases(title) & phrases(report)
    # never across a clause, nor a pair with the matrix's own subject, nor a code-like word split (LoRA, ValueError)
    assert "fp32 trainable" not in phrases("frozen weights upcast to fp32 with the trainable ones")
    assert not phrases("under FSDP2 with LoRA") and "lo ra" not in phrases("QLoRA and LoRA")
    # a title's code-like words are counted once, not again as a pair; what every report says is no pair
    titles = [("a", "TRL SFTTrainer with fully_shard: ValueError raised"), ("b", "a DPOTrainer run")]
    assert held(titles, "TRL SFTTrainer under fully_shard: the error raised")["a"] == (
        "fully_shard",
        "sfttrainer",
        "trl",
    )


def test_a_case_whose_title_names_no_fsdp_is_named_by_words_without_fsdp():
    """gc-frozen-inputs fails without FSDP too (its title names none): reports of it named it only with FSDP shown."""
    text = "gradient checkpointing enabled after the PEFT model is created leaves nothing with requires_grad\n"
    assert _first(text) == ("gc-frozen-inputs", "weak")
    # without an adapter it is another failure (a model frozen in part), and a case that is FSDP's still needs FSDP
    assert _first(text.replace("the PEFT model", "freezing the encoder, the model")) == (None, None)
    assert _first("get_peft_model on a model already sharded by fully_shard, LoRA\n".replace("fully_shard", "x")) == (
        None,
        None,
    )


def test_a_case_whose_title_names_no_fsdp_is_named_by_words_under_another_stack():
    """gc-frozen-inputs' message is claimed under DeepSpeed when an adapter shows; its words were not (any other stack
    stopped every claim from words), though users report it from DeepSpeed runs."""
    text = (
        "DeepSpeed ZeRO-3 run: with gradient checkpointing on, the LoRA model from get_peft_model trains nothing.\n"
        "Calling model.enable_input_require_grads() before get_peft_model fixed it.\n"
    )
    assert _first(text) == ("gc-frozen-inputs", "weak")
    # a case whose failure is FSDP's (its title says so) is still not named from words of another stack's report
    sharded = "DeepSpeed ZeRO-3 run: LoRA with modules_to_save=['lm_head'], a trainable copy of the head\n"
    assert _first(sharded) == (None, None)
    assert _first(sharded.replace("DeepSpeed ZeRO-3", "FSDP")) == ("modules-to-save", "weak")
    # a report of both stacks (a PR adding QLoRA to each) names an FSDP case by its words as a report of FSDP does
    both = "Add support for FSDP+QLoRA and DeepSpeed ZeRO3+QLoRA: a new bnb_4bit_quant_storage option\n"
    assert _first(both) == ("mixed-dtype", "weak")


def test_an_axis_meaning_names_its_own_setting_not_the_call_it_belongs_to():
    meaning = "get_peft_model's autocast_adapter_dtype (1 = adapters upcast to fp32, 0 = kept in the base dtype)"
    assert prose.setting_names(meaning) == {"autocast_adapter_dtype"}
    # the values' list after the head explains each value: its names are not the axis's setting
    meaning = "bitsandbytes 4-bit quant_storage dtype: uint8 (the default) or bf16 (prepare_model_for_kbit_training)"
    assert prose.setting_names(meaning) == {"quant_storage"}
    # the argument every TRL report passes its adapter in is the matrix's subject, not a setting of one case
    assert prose.setting_names("the TRL trainer given the base model and peft_config: sft (SFTTrainer)") == set()


def test_a_setting_a_case_s_failure_turns_on_is_a_word_of_the_case():
    """mixed-dtype's rules fail on the 4-bit storage (its ``storage`` axis, which one other case's rules turn on):
    reports of FSDP + QLoRA that name the quant_storage setting named no case (qlora is five cases' word)."""
    text = "Initial FSDP support for QLoRA: adds a selectable `quant_storage` option, as FSDP shards floats only.\n"
    assert _first(text) == ("mixed-dtype", "weak")
    # an axis that many cases' failing rules turn on (wrap, orig) is setup they share, not a word of one of them
    assert "use_orig_params" not in match_module._failure_settings(MATRIX)["lora-requires-grad"]


def test_a_setting_is_held_inside_a_longer_identifier_that_spells_it():
    """A library spells a setting with its own prefix or suffix (transformers' ``bnb_4bit_quant_storage``, accelerate's
    ``fsdp_use_orig_params``): the setting was held only as a whole word."""
    titles = [("a", "x: quant_storage"), ("b", "y: use_orig_params")]
    assert held(titles, "add bnb_4bit_quant_storage to the config") == {"a": ("quant_storage",)}
    assert held(titles, "fsdp_use_orig_params: false") == {"b": ("use_orig_params",)}
    assert held(titles, "requant_storage or quant_storaged") == {}  # inside a word is not the setting
    text = "fix fsdp & qlora support\n\nadd fsdp_qlora config and bnb_4bit_quant_storage\n"
    assert _first(text) == ("mixed-dtype", "weak")


def test_a_fix_that_gathers_full_parameters_is_not_a_full_fine_tune():
    """'gather full parameters' read as full fine-tuning, which stops every claim from words."""
    text = (
        "Handle FSDP-sharded parameters in LoRA ParamWrapper: with MoE layers via target_parameters the reshape fails;"
        " the fix uses FSDP.summon_full_params() to gather full parameters when needed\n"
    )
    assert _first(text) == ("moe-target-parameters", "weak")


def test_a_case_the_report_s_stack_rules_out_does_not_tie_with_one_it_allows():
    """Two FSDP cases named by TRL's trainers as much as gc-frozen-inputs by its words, in a report with no FSDP, made a
    tie and no claim, though neither can be named without FSDP."""
    text = (
        "On a single GPU with TRL's SFTTrainer and GRPOTrainer, the vision LoRA gets zero gradients: with gradient\n"
        "checkpointing on, the hook that makes the inputs require grad lands on the language model only.\n"
    )
    assert _first(text) == ("gc-frozen-inputs", "weak")
    # with FSDP shown, the tie stands: nothing tells the cases apart
    assert _first(text.replace("On a single GPU", "Under FSDP")) == (None, None)


def test_two_cases_of_one_failure_named_alike_name_the_first_with_the_other_tied():
    """gc-frozen-inputs and ac-entries expect one error (no-grad-fn): words naming both alike named neither."""
    text = "Turned on grad checkpointing after get_peft_model: the LoRA model trains nothing\n"
    [first] = claims(match(MATRIX, parse(text)))
    assert (first.case.id, first.level, first.tied) == ("gc-frozen-inputs", "weak", "ac-entries")
    # cases named alike that expect different errors are still no answer
    assert named([("a", "x_setting y_setting"), ("b", "x_setting y_setting z")], "x_setting and y_setting") is None


def test_words_name_a_case_that_expects_only_a_warning():
    """fsdp1-frozen-mixed-unit expects a UserWarning, no error: its words named it with no rule to cite, so no claim."""
    text = "LoRA under FSDP with use_orig_params=True: the gradient memory is that of an unfrozen model\n"
    assert _first(text) == ("fsdp1-frozen-mixed-unit", "weak")


def test_an_environment_listing_and_an_error_named_in_a_sentence_are_not_the_report_s_words():
    """``- TRL version: 0.9.6`` named TRL as a word of the report; an exception named inline did not stop a claim."""
    text = "fsdp+qlora training with TRL fails at step 0\n"
    assert _first(text) == ("trl-qlora-upcast", "weak")
    assert _first(text.replace(" with TRL", "") + "- TRL version: 0.9.6\n") == (None, None)
    assert _first(text.replace("step 0", "step 0 with `RuntimeError: CUDA error: invalid argument`")) == (None, None)


def test_a_word_broken_where_a_line_wraps_is_read_whole():
    """A report copied from a terminal or an e-mail is cut at its width, inside a word as often as between two: the
    words on either side of a line break are read joined too (``a`` / ``ssertion error``)."""
    report = (
        "### fsdp + lora\n\nLoRA modules are loaded in float32. Running the code with a bf16 model would trigger an"
        " FSDP2 dtype assertion error, since float32 and bfloat16 cannot be wrapped together.\n"
    )
    whole = _first(report)
    assert whole[0] == "fsdp2-mixed-dtype-unit"
    at = report.index("ssertion")
    assert _first(report[:at] + "\n" + report[at:]) == whole
    # a word that ends a line is not joined to the next line's only: both readings are kept
    assert _first(report.replace(" assertion", "\nassertion")) == whole


def test_a_call_of_a_case_s_title_the_report_makes_is_its_trigger_and_counts_twice():
    """A report in words that calls the entry a case's title writes as a call (``disable_adapter()``) names the
    failure's trigger; a setting it names beside it (``use_orig_params``) is the setup many cases share. One such
    call was one word against one: a tie, nothing named."""
    text = (
        "PEFT LoRA model wrapped with FSDP(model, use_orig_params=True):\n"
        "    with model.disable_adapter():\n"
        "        ref_logits = model(**batch).logits\n"
        "crashes in the forward.\n"
    )
    found = named(TITLES, text)
    assert found is not None and found.case == "disable-adapter" and found.score == 2
    assert _first(text) == ("disable-adapter", "weak")
    # the name as a word, not a call, is one word as before: a tie with use_orig_params' cases
    mentioned = text.replace("with model.disable_adapter():", "(the adapter disabled, as disable_adapter does)")
    assert named(TITLES, mentioned) is None
    # a call two cases' titles write (generate(): FSDP1's and FSDP2's) counts for both: still a tie, nothing named
    generating = "PEFT LoRA model wrapped with FSDP:\n    out = model.generate(**inputs)\nis very slow.\n"
    assert _first(generating) == (None, None)
    # the call beside another error is still that other error
    assert _first(text + "torch.OutOfMemoryError: CUDA out of memory.\n") == (None, None)
