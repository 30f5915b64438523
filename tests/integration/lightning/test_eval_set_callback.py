"""``SpeculativeDecodingCallback`` on named evaluation sets: per-set tau and its interval reach the Lightning loggers.

One real fit on the demo target whose only validation comes after its last step, so the model the test decodes
with afterwards is the one the callback measured: the logged tau must equal total emitted / total target forwards
recomputed here from per-step acceptance counts, on prompts loaded here without the callback's helper. A missing or
malformed set fails before training, naming the set and the file; a stop request ends the eval sets between prompts.
"""

from __future__ import annotations

import csv
import json
import re
from types import SimpleNamespace

import pytest
import torch
import yaml
from helpers.drafters import build
from helpers.paths import ROOT
from helpers.quickstart import quickstart_fit_args

from dspark_lightning.cli import cli_main
from dspark_lightning.decoding import speculative_generate
from dspark_lightning.errors import OptionError
from dspark_lightning.lightning.callbacks import ValidationSummary
from dspark_lightning.measuring import eval_sets
from dspark_lightning.measuring.callback import SpeculativeDecodingCallback
from dspark_lightning.measuring.eval_sets import EvalSetError, load_eval_set, prompt_token_ids
from dspark_lightning.measuring.in_training import decode_eval_set
from dspark_lightning.measuring.intervals import ratio_bootstrap_ci

DECODING = "dspark_lightning.measuring.callback.SpeculativeDecodingCallback"
VAL = ROOT / "assets/data/sharegpt/validation-00000.jsonl"
MAX_NEW_TOKENS = 12


def fit_args(run_dir, decode_args: dict, steps: int = 40) -> list[str]:
    decode = {"class_path": DECODING, "init_args": decode_args}
    summary = {"class_path": "dspark_lightning.lightning.callbacks.ValidationSummary"}
    return [
        *quickstart_fit_args(VAL),
        "--data.seq_len=128", "--data.batch_size=2", "--data.limit_val_samples=8", "--model.drafter.max_anchors=8",
        f"--trainer.max_steps={steps}", f"--trainer.val_check_interval={steps}", "--trainer.limit_val_batches=1",
        f"--trainer.callbacks={json.dumps([decode, summary])}", "--trainer.enable_progress_bar=false",
        "--trainer.logger=lightning.pytorch.loggers.CSVLogger", f"--trainer.logger.save_dir={run_dir}",
        "--trainer.logger.name=run",
    ]  # fmt: skip


def recomputed(module, prompts: list[list[int]], mode: str) -> tuple[list[int], list[int]]:
    """(emitted tokens, verifying target forwards) per prompt with a verify step, from each step's accepted count."""
    emitted, forwards = [], []
    for prompt in prompts:
        _, stats = speculative_generate(
            module.target, module.drafter, torch.tensor([prompt]), MAX_NEW_TOKENS, mode=mode, k=16
        )
        if stats.accepted_per_step:
            emitted.append(sum(accepted + 1 for accepted in stats.accepted_per_step))  # drafts kept + the target's
            forwards.append(len(stats.accepted_per_step))
    return emitted, forwards


def test_callback_logs_each_sets_tau_with_an_interval_that_brackets_it(tmp_path, capsys):
    decode = {
        "modes": ["markov"], "num_prompts": 1, "max_new_tokens": MAX_NEW_TOKENS,
        "eval_sets": ["sharegpt_heldout", "humaneval"], "eval_set_limit": 3,
    }  # fmt: skip
    cli = cli_main(fit_args(tmp_path, decode))
    rows = list(csv.DictReader((tmp_path / "run/version_0/metrics.csv").open()))
    logged = next(row for row in rows if row.get("val/tau"))
    assert logged["val/decode/markov/tau"]  # what it logged before eval sets is still there
    callback = next(c for c in cli.trainer.callbacks if isinstance(c, SpeculativeDecodingCallback))
    data, module = cli.datamodule, cli.model
    module.eval()
    for name in ("sharegpt_heldout", "humaneval"):
        # the prompts as the eval-set loader gives them, in the data module's chat template
        loaded = load_eval_set(name, limit=3, val_files=str(VAL), encoder=data.encoder, max_prompt_tokens=128)
        prompts = prompt_token_ids(loaded, data.tokenizer)
        assert callback.eval_set_prompts[name] == prompts and len(prompts) == 3
        emitted, forwards = recomputed(module, prompts, "markov")
        key = f"val/decode/{name}/markov"
        tau = float(logged[f"{key}/tau"])
        assert tau > 1.0  # 40 steps: the drafter is right sometimes, so the comparison below is not 1 == 1
        assert tau == pytest.approx(sum(emitted) / sum(forwards), rel=1e-6)
        low, high = float(logged[f"{key}/tau_ci_low"]), float(logged[f"{key}/tau_ci_high"])
        assert 1.0 <= low <= tau <= high <= MAX_NEW_TOKENS
        assert (low, high) == pytest.approx(ratio_bootstrap_ci(emitted, forwards), rel=1e-6)  # 10,000 resamples, seed 0
        assert float(logged[f"{key}/num_prompts"]) == len(forwards)
    assert [(s.eval_set, s.mode, callback.last_eval_sets_step) for s in callback.last_eval_sets] == [
        ("sharegpt_heldout", "markov", 40),
        ("humaneval", "markov", 40),
    ]
    printed = capsys.readouterr().out
    assert (
        "decoding 1 prompts, eval set sharegpt_heldout (3 prompts), eval set humaneval (3 prompts) x 1 modes" in printed
    )
    humaneval = float(logged["val/decode/humaneval/markov/tau"])  # the end-of-run summary shows it with its interval
    assert re.search(rf"tau measured on humaneval \(markov\) +│ +{humaneval:.4f} \[", printed)


def test_missing_or_malformed_eval_sets_fail_before_training_naming_set_and_file(tmp_path, monkeypatch):
    missing = tmp_path / "heldout.jsonl"
    decode = {"modes": ["markov"], "eval_sets": ["sharegpt_heldout"], "heldout_files": str(missing)}
    with pytest.raises(
        EvalSetError, match=f"eval set 'sharegpt_heldout': cannot read .*{missing}.*the files of heldout_files"
    ):
        cli_main(fit_args(tmp_path, decode))
    assert not (tmp_path / "run/version_0/checkpoints").exists()  # not one training step
    garbled = tmp_path / "HumanEval.jsonl"
    garbled.write_text('{"task_id": "T/0", "prompt": "def f():\\n"}\n{"task_id": "T/1"}\n')
    monkeypatch.setattr(eval_sets, "humaneval_path", lambda: str(garbled))
    with pytest.raises(EvalSetError, match=f"eval set 'humaneval': {garbled}:2: record has no 'prompt' string"):
        cli_main(fit_args(tmp_path, {"modes": ["markov"], "eval_sets": ["humaneval"]}))
    with pytest.raises(SystemExit):  # an unknown name is refused when the YAML is parsed, naming the option
        cli_main(fit_args(tmp_path, {"eval_sets": ["mmlu"]}))
    with pytest.raises(OptionError, match="eval_set_limit must be >= 1"):
        SpeculativeDecodingCallback(eval_sets=["humaneval"], eval_set_limit=0)
    with pytest.raises(OptionError, match=r"unknown eval sets \['mmlu'\]"):
        SpeculativeDecodingCallback(eval_sets=["mmlu"])


def test_eval_sets_stop_between_prompts_when_asked():
    target, drafter = build()
    prompts = [[1, 2, 3], [4, 5, 6, 7], [8, 9]]
    asked = []

    def stop() -> bool:  # a SIGTERM arrives while the second prompt decodes
        asked.append(1)
        return len(asked) > 2

    assert decode_eval_set(target, drafter, prompts, "parallel", 6, 4, stop=stop) is None
    assert len(asked) == 3  # asked before each prompt: the third one was never started
    records = decode_eval_set(target, drafter, prompts, "parallel", 6, 4, stop=lambda: False)
    assert 0 < len(records) <= 3 and all(r.target_forwards >= 1 for r in records)


def test_a_stopped_callback_logs_no_eval_set(capsys):
    target, drafter = build()
    callback = SpeculativeDecodingCallback(modes=["parallel"], num_prompts=0, eval_sets=["humaneval"])
    callback.eval_set_prompts = {"humaneval": [[1, 2, 3]]}
    logged = []
    module = SimpleNamespace(target=target, drafter=drafter, log=lambda *args, **kwargs: logged.append(args))
    trainer = SimpleNamespace(
        sanity_checking=False, datamodule=object(), strategy=None, is_global_zero=True, global_step=3,
        received_sigterm=True,
    )  # fmt: skip
    callback.on_validation_epoch_end(trainer, module)
    assert logged == [] and callback.last_eval_sets == []
    assert "stopped on SIGTERM, the rest of the eval sets is skipped" in capsys.readouterr().out


def test_summary_shows_each_sets_tau_with_its_interval(capsys):
    metrics = {
        "val/decode/markov/tau": torch.tensor(1.25),
        "val/decode/humaneval/markov/tau": torch.tensor(1.3125),
        "val/decode/humaneval/markov/tau_ci_low": torch.tensor(1.1),
        "val/decode/humaneval/markov/tau_ci_high": torch.tensor(1.55),
    }
    trainer = SimpleNamespace(global_step=7, is_global_zero=True, callback_metrics=metrics)
    ValidationSummary().on_fit_end(trainer, SimpleNamespace(last_validation={"acceptance/tau": torch.tensor(1.5)}))
    printed = capsys.readouterr().out
    assert re.search(r"tau measured \(markov decoding\) +│ +1\.2500 │", printed)
    assert re.search(r"tau measured on humaneval \(markov\) +│ +1\.3125 \[1\.100, 1\.550\] │", printed)


@pytest.mark.parametrize("config", ["quickstart.yaml", "qwen3_0_6b_sharegpt.yaml", "qwen3_8b_sharegpt.yaml"])
def test_the_configs_commented_eval_set_keys_parse_when_uncommented(config, tmp_path, capsys):
    text = (ROOT / "configs" / config).read_text()
    commented = re.findall(r"^( +)# (eval_set\w*: .*?) +#", text, re.M)
    assert [key.split(":")[0] for _, key in commented] == ["eval_sets", "eval_set_limit"]
    uncommented = re.sub(r"^( +)# (eval_set\w*: .*?) +#", r"\1\2  #", text, flags=re.M)
    (tmp_path / config).write_text(uncommented)
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["fit", "--config", str(tmp_path / config), "--print_config"])
    assert exit_info.value.code == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    decode = next(c for c in printed["trainer"]["callbacks"] if c["class_path"] == DECODING)["init_args"]
    assert decode["eval_sets"] == ["sharegpt_heldout", "humaneval"] and decode["eval_set_limit"] in (8, 16)
