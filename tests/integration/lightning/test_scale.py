"""Scale path: anchor budget and coverage, strategy configs, DDP validation = one process, regeneration jobs."""

from __future__ import annotations

import csv
import json
import os
import re
import shlex
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
import yaml
from helpers.paths import ROOT

from dspark_lightning.cli import cli_main
from dspark_lightning.models.anchors import (
    Anchors,
    anchor_coverage_counts,
    sample_anchors,
    valid_anchor_mask,
)

DEMO_TARGET = ROOT / "assets/demo-target"
VAL = ROOT / "assets/data/sharegpt/validation-00000.jsonl"


def packed_rows(lengths_per_row, supervised_from=2, seq_len=64):
    """Rows of consecutive documents; each document supervised from its ``supervised_from``-th token on."""
    rows = len(lengths_per_row)
    loss_mask = torch.zeros(rows, seq_len, dtype=torch.bool)
    documents = torch.full((rows, seq_len), -1)
    for r, lengths in enumerate(lengths_per_row):
        start = 0
        for d, n in enumerate(lengths):
            documents[r, start : start + n] = d
            loss_mask[r, start + supervised_from : start + n] = True
            start += n
    return loss_mask, documents


# ------------------------------------------------------------------------------------------------ anchor coverage
def brute_force_coverage(anchors: Anchors, loss_mask, block_size, sample_from_anchor):
    covered = set()
    for r in range(loss_mask.shape[0]):
        for p, ok in zip(anchors.positions[r].tolist(), anchors.valid[r].tolist()):
            if not ok:
                continue
            last = block_size if sample_from_anchor else block_size - 1
            for t in range(p + 1, p + last + 1):
                if t < loss_mask.shape[1] and loss_mask[r, t]:
                    covered.add((r, t))
    return len(covered), int(loss_mask.sum())


@pytest.mark.parametrize("budget", ["uniform", "per_document"])
@pytest.mark.parametrize("sample_from_anchor", [True, False])
def test_anchor_coverage_matches_brute_force(budget, sample_from_anchor):
    torch.manual_seed(0)
    loss_mask, documents = packed_rows([(30, 9, 14), (50,), (6, 6, 40)])
    loss_mask &= torch.rand(loss_mask.shape) > 0.2  # holes: unsupervised tokens inside documents
    generator = torch.Generator().manual_seed(1)
    for max_anchors in (1, 3, 8, 64):
        anchors = sample_anchors(loss_mask, documents, 4, max_anchors, sample_from_anchor, generator, budget)
        covered, supervised = anchor_coverage_counts(anchors, loss_mask, 4, sample_from_anchor)
        assert (int(covered), int(supervised)) == brute_force_coverage(anchors, loss_mask, 4, sample_from_anchor)


# ------------------------------------------------------------------------------------------------- anchor budget
def anchors_per_document(anchors: Anchors, documents) -> list[Counter]:
    return [Counter(documents[r, anchors.positions[r][anchors.valid[r]]].tolist()) for r in range(documents.shape[0])]


def test_per_document_budget_gives_short_documents_anchors_in_proportion():
    # row 0: a long conversation and two short ones; row 1: one document; row 2: budget larger than the valid slots
    loss_mask, documents = packed_rows([(40, 10, 12), (60,), (8, 9)])
    valid = valid_anchor_mask(loss_mask, documents, 4, True)
    generator = torch.Generator().manual_seed(0)
    uniform_missed = 0
    for _ in range(200):
        anchors = sample_anchors(loss_mask, documents, 4, 6, True, generator, "per_document")
        counts = anchors_per_document(anchors, documents)
        assert valid.gather(1, anchors.positions)[anchors.valid].all()
        for r in range(3):  # distinct, ascending
            chosen = anchors.positions[r][anchors.valid[r]].tolist()
            assert chosen == sorted(set(chosen))
        # supervised tokens 38 / 8 / 10: Sainte-Lague with one anchor guaranteed each -> 4 / 1 / 1
        assert counts[0] == {0: 4, 1: 1, 2: 1}
        assert counts[1] == {0: 6}
        # row 2 has 2 + 3 valid positions < 6 anchors: all taken, never duplicated
        assert counts[2] == {0: 2, 1: 3} and int(anchors.valid[2].sum()) == 5
        uniform = sample_anchors(loss_mask, documents, 4, 6, True, generator, "uniform")
        uniform_missed += len(anchors_per_document(uniform, documents)[0]) < 3
    assert uniform_missed > 20  # the uniform budget often leaves a short conversation without anchors


def test_per_document_budget_is_uniform_within_documents_and_weighted_when_scarce():
    loss_mask, documents = packed_rows([(20, 44)], supervised_from=2)  # 18 and 42 supervised tokens
    generator = torch.Generator().manual_seed(2)
    position_counts = torch.zeros(64)
    document_counts = Counter()
    trials = 3000
    for _ in range(trials):
        anchors = sample_anchors(loss_mask, documents, 4, 1, True, generator, "per_document")
        document_counts.update(anchors_per_document(anchors, documents)[0])
        many = sample_anchors(loss_mask, documents, 4, 10, True, generator, "per_document")
        position_counts[many.positions[many.valid]] += 1
    # one anchor for two documents: drawn with probability proportional to supervised tokens (18 : 42)
    assert abs(document_counts[0] / trials - 18 / 60) < 0.03
    # 10 anchors -> 3 and 7 (Sainte-Lague); each document's valid positions are equally likely
    first = position_counts[2:16]  # document 0: valid anchors 2..15 (14 of them), 3 each
    second = position_counts[22:60]  # document 1: valid anchors 22..59 (38 of them), 7 each
    assert position_counts.sum() == 10 * trials
    assert (first / trials - 3 / 14).abs().max() < 0.04 and (second / trials - 7 / 38).abs().max() < 0.04


def test_uniform_budget_is_the_default_draw():
    loss_mask, documents = packed_rows([(30, 20), (50,)])
    a = sample_anchors(loss_mask, documents, 4, 5, True, torch.Generator().manual_seed(4))
    b = sample_anchors(loss_mask, documents, 4, 5, True, torch.Generator().manual_seed(4), budget="uniform")
    assert torch.equal(a.positions, b.positions) and torch.equal(a.valid, b.valid)
    with pytest.raises(ValueError, match="anchor budget"):
        sample_anchors(loss_mask, documents, 4, 5, budget="by_length")


# ---------------------------------------------------------------------------------------------- strategy configs
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_strategy_configs_pass_print_config(strategy, capsys):
    base = [
        "--config",
        str(ROOT / "configs/quickstart.yaml"),
        "--config",
        str(ROOT / f"configs/strategy/{strategy}.yaml"),
    ]
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["fit", *base, "--print_config"])
    assert exit_info.value.code == 0
    printed = yaml.safe_load(capsys.readouterr().out)["trainer"]
    if strategy == "fsdp":
        assert printed["strategy"]["class_path"].endswith("FSDPStrategy")
        assert printed["strategy"]["dict_kwargs"]["use_orig_params"] is True
        assert printed["precision"] == "bf16-mixed"
    else:
        assert printed["strategy"]["class_path"].endswith("DDPStrategy") and printed["devices"] == "auto"


# ------------------------------------------------------------------------------------------ DDP = one process
def validate_args(save_dir: Path) -> list[str]:
    return [
        "validate", f"--model.target.path={DEMO_TARGET}", f"--data.val_files={VAL}", "--data.limit_val_samples=24",
        "--data.seq_len=128", "--data.batch_size=2", "--model.drafter.max_anchors=8", "--trainer.accelerator=cpu",
        "--trainer.limit_val_batches=1.0", "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
        "--trainer.logger=lightning.pytorch.loggers.CSVLogger", f"--trainer.logger.save_dir={save_dir}",
        "--trainer.logger.name=run",
    ]  # fmt: skip


def test_ddp_validation_on_two_cpu_processes_equals_one_process(tmp_path):
    """Evaluation anchors are per document and the acceptance metrics are sum states, so 2 ranks = 1 process."""
    one = cli_main([*validate_args(tmp_path / "one"), "--trainer.devices=1"])
    expected = {k: float(v) for k, v in one.trainer.callback_metrics.items()}
    exe = Path(sys.executable).with_name("dspark-lightning")
    env = dict(os.environ, WANDB_MODE="disabled", OMP_NUM_THREADS="1")
    # callbacks that draw figures on rank 0 only (they once deadlocked DDP through trainer.log_dir's broadcast)
    figures = tmp_path / "figures.yaml"
    figures.write_text(
        "trainer:\n  callbacks:\n"
        "    - class_path: dspark_lightning.lightning.callbacks.AcceptanceCurves\n"
        "    - class_path: dspark_lightning.lightning.callbacks.SelectorEquivalenceCallback\n"
    )
    command = [str(exe), *validate_args(tmp_path / "two"), "--trainer.devices=2", "--trainer.strategy=ddp"]
    command += ["--config", str(figures)]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    (metrics_file,) = (tmp_path / "two" / "run").glob("version_*/metrics.csv")
    assert list(metrics_file.parent.glob("plots/val_selector_coverage_*.png"))
    two = {k: float(v) for k, v in list(csv.DictReader(metrics_file.open()))[-1].items() if v and k.startswith("val/")}
    exact = [k for k in expected if k.startswith(("val/tau", "val/accept_rate", "val/greedy", "val/confidence/"))]
    exact += ["val/anchor_coverage"]
    assert "val/tau" in exact and len(exact) > 20
    for key in exact:  # torchmetrics sum states: equal up to float summation order
        assert two[key] == pytest.approx(expected[key], rel=1e-5, abs=1e-7), key
    assert expected["val/tau"] > 1.0


@pytest.mark.slow
def test_fsdp_shards_the_frozen_target_on_two_cpu_processes(tmp_path):
    """Lightning's FSDPStrategy refuses CPU, so this drives torch FSDP (gloo) the way the strategy does: the
    wrapping context around ``configure_model``, the root unit, the step inside the root's forward."""
    script = ROOT / "tests" / "helpers" / "fsdp_cpu_worker.py"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    result = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "out.json")], capture_output=True, text=True, env=env, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = json.loads((tmp_path / "out.json").read_text())
    for rank in ranks:
        assert rank["fsdp_units"] == 1 + 4 + 1  # root + 4 target decoder layers + 1 draft layer
        assert rank["loss"] == pytest.approx(rank["unsharded_loss"], rel=1e-5)
        assert rank["target_grads"] == 0 and rank["drafter_grads"] > 0 and rank["target_unchanged"]


# -------------------------------------------------------------------------------------------- regeneration jobs
def test_regenerate_parallel_jobs_split_records_without_overlap(tmp_path):
    from dspark_lightning.preparation.regenerate import regenerate

    data = tmp_path / "in.jsonl"
    lines = VAL.read_text().splitlines()[:5]
    data.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    kwargs = dict(max_new_tokens=4, batch_size=2, shard_size=2, device="cpu")
    summaries = [regenerate(str(DEMO_TARGET), str(data), out, num_jobs=2, job_index=i, **kwargs) for i in (1, 0)]
    again = regenerate(str(DEMO_TARGET), str(data), out, num_jobs=2, job_index=0, **kwargs)  # resumes: nothing to do
    assert again.get("written", 0) == 0 and again["skipped_already_done"] == summaries[1]["written"]
    names = sorted(p.name for p in out.glob("*.jsonl"))
    assert names == ["train-000of002-00000.jsonl", "train-000of002-00001.jsonl", "train-001of002-00000.jsonl"]
    ids = [json.loads(line)["id"] for p in out.glob("train-*.jsonl") for line in p.read_text().splitlines()]
    assert len(ids) == len(set(ids)) == sum(s["written"] for s in summaries) == 5


# ---------------------------------------------------------------------------------- the "Scaling up" guide
def doc_commands(fence: str) -> list[list[str]]:
    """The ``dspark-lightning`` command lines of the ``fence`` code blocks of the "Scaling up" guide."""
    text = (ROOT / "docs/guides/scaling_up.md").read_text()
    commands = []
    for block in re.findall(rf"```{fence}\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            starts = [i for i, word in enumerate(words) if "dspark-lightning" in word]
            if starts:
                commands.append(words[starts[0] + 1 :])
    return commands


def test_scaling_doc_commands_run_at_demo_scale(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the commands use repository-relative paths
    ran = Counter()
    for args in doc_commands("bash"):
        args = [str(tmp_path / a) if a.startswith(("cache/", "data/regenerated")) else a for a in args]
        if "--engine" in args and not os.environ.get("DSPARK_VLLM_PYTHON"):
            continue  # vLLM's interpreter: tests/unit/preparation/test_regenerate_vllm.py, when the variable is set
        if args[0] == "cache":
            cli_main([*args, "--limit", "4", "--device", "cpu"])
        elif args[0] == "regenerate":
            cli_main([*args, "--limit", "2", "--max_new_tokens", "4", "--batch_size", "2", "--device", "cpu"])
        else:
            extra = [
                "--trainer.max_steps=2", "--trainer.val_check_interval=2", "--trainer.limit_val_batches=2",
                "--trainer.callbacks=[]", "--trainer.logger=lightning.pytorch.loggers.CSVLogger",
                f"--trainer.logger.save_dir={tmp_path / 'runs'}", "--data.batch_size=2", "--model.drafter.max_anchors=8",
            ]  # fmt: skip
            if "configs/cache.yaml" in args:
                extra += [
                    f"--data.train_cache={tmp_path / 'cache/train'}",
                    f"--data.val_cache={tmp_path / 'cache/val'}",
                ]
            cli = cli_main([*args, *extra])
            assert float(cli.trainer.callback_metrics["val/anchor_coverage"]) > 0
        ran[args[0]] += 1
    assert ran == {"cache": 2, "fit": 2, "regenerate": 3 if os.environ.get("DSPARK_VLLM_PYTHON") else 2}
    assert len(list((tmp_path / "data/regenerated").glob("train-00?of002-00000.jsonl"))) == 2
    cluster = doc_commands("sh")
    assert len(cluster) == 4
    for args in cluster:  # GPU / multi-node launches: the arguments must parse
        with pytest.raises(SystemExit) as exit_info:
            cli_main([*args, "--print_config"])
        assert exit_info.value.code == 0
