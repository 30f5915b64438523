"""The config groups of DSparkModule: old flat checkpoints migrate field by field, every field is documented in --help."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap

import pytest

from dspark_lightning.cli import cli_main
from dspark_lightning.lightning.config import GROUPS, LossArgs, TargetArgs, TrainingArgs, as_group, migrate_hparams
from dspark_lightning.lightning.fit import wants_help
from dspark_lightning.models import DrafterConfig, MarkovHeadConfig

# the hyper-parameters a checkpoint written before the config groups holds (the SmolLM2 report runs' key set)
OLD_FLAT = {
    "_instantiator": "lightning.pytorch.cli.instantiate_module",
    "anchor_budget": "per_document",
    "attention_backend": "sdpa",
    "block_size": 6,
    "candidate_k": 8,
    "candidate_loss_weight": 0.5,
    "candidate_rule": "exclude",
    "compile": True,
    "confidence_alpha": 0.5,
    "confidence_head": True,
    "confidence_with_markov": True,
    "draft_vocab": "assets/smollm2/draft_vocab.safetensors",
    "gamma": 7.0,
    "head_dim": None,
    "intermediate_size": 96,
    "layer_types": None,
    "lk_eta": 2.0,
    "loss": {"kl": 1.0},
    "loss_chunk_size": 128,
    "lr_warmup_steps": 100,
    "markov_head": {
        "class_path": "dspark_lightning.models.MarkovHeadConfig",
        "init_args": {"rank": 64, "head_type": "gated", "gate_input": "hidden", "gate_activation": "identity"},
    },
    "mask_token_id": 5,
    "max_anchors": 32,
    "nla_alpha_min": 1e-5,
    "num_heads": 4,
    "num_kv_heads": 2,
    "num_layers": 2,
    "position_weighting": "dpace",
    "sample_from_anchor": False,
    "seed": 3,
    "sliding_window": 64,
    "target": "targets/smollm2-135m-instruct",
    "target_dtype": "bfloat16",
    "target_features": "cache",
    "target_layer_ids": [1, 14, 27],
    "train_lm_head": True,
    "trust_remote_code": False,
    "val_anchor_stride": 4,
}


def test_old_flat_hyper_parameters_move_into_their_groups():
    groups = migrate_hparams(OLD_FLAT)
    assert set(groups) == set(GROUPS)
    assert as_group(TargetArgs, groups["target"]) == TargetArgs(
        "targets/smollm2-135m-instruct", dtype="bfloat16", trust_remote_code=False, features="cache"
    )
    assert as_group(LossArgs, groups["loss"]) == LossArgs(
        weights={"kl": 1.0}, position_weighting="dpace", gamma=7.0, lk_eta=2.0, nla_alpha_min=1e-5, chunk_size=128,
        confidence_alpha=0.5, candidate_weight=0.5, candidate_k=8, candidate_rule="exclude",
    )  # fmt: skip
    assert as_group(TrainingArgs, groups["training"]) == TrainingArgs(
        anchor_budget="per_document", seed=3, val_anchor_stride=4, lr_warmup_steps=100, compile=True
    )
    assert as_group(DrafterConfig, groups["drafter"]) == DrafterConfig(
        block_size=6, num_layers=2, max_anchors=32, sample_from_anchor=False, mask_token_id=5,
        target_layer_ids=[1, 14, 27], markov_head=MarkovHeadConfig.selector(64), confidence_head=True,
        confidence_with_markov=True, draft_vocab="assets/smollm2/draft_vocab.safetensors", train_lm_head=True,
        num_heads=4, num_kv_heads=2, head_dim=None, intermediate_size=96, attention_backend="sdpa",
        sliding_window=64, layer_types=None,
    )  # fmt: skip
    # the groups are what a current checkpoint holds: migrating again changes nothing
    assert migrate_hparams(groups) == groups


def test_old_null_loss_means_the_default_weights_and_unknown_names_fail():
    assert migrate_hparams({**OLD_FLAT, "loss": None})["loss"]["weights"] == LossArgs().weights
    assert migrate_hparams({**OLD_FLAT, "markov_head": None})["drafter"]["markov_head"] is None
    with pytest.raises(ValueError, match="'markov_rank'"):
        migrate_hparams({**OLD_FLAT, "markov_rank": 8})


@pytest.mark.parametrize("cls", [*GROUPS.values(), MarkovHeadConfig])
def test_every_config_field_has_one_attribute_docstring(cls):
    """Each field is followed by a string literal (litgpt style), which jsonargparse shows in ``--help``."""
    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
    documented = {
        node.target.id
        for node, after in zip(body, body[1:])
        if isinstance(node, ast.AnnAssign)
        and isinstance(after, ast.Expr)
        and isinstance(after.value, ast.Constant)
        and isinstance(after.value.value, str)
    }
    assert documented == {f.name for f in dataclasses.fields(cls)}


def test_fit_help_shows_the_field_docstrings(capsys):
    """Only a command line that prints help reads the docstrings (reading them costs every parse a second or more)."""
    assert not wants_help(["fit", "--config", "configs/quickstart.yaml", "--print_config"])
    assert all(wants_help(["fit", *a]) for a in (["-h"], ["--print_config=comments"], ["--model.help", "X"]))
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["fit", "--help"])
    assert exit_info.value.code == 0
    assert " ".join(capsys.readouterr().out.split()).count("Tokens per draft block B (>= 2)") == 1


@pytest.mark.parametrize(
    ("build", "option"),
    [
        (lambda: TargetArgs(features="offline"), "model.target.features"),
        (lambda: LossArgs(position_weighting="linear"), "model.loss.position_weighting"),
        (lambda: LossArgs(candidate_rule="drop"), "model.loss.candidate_rule"),
        (lambda: LossArgs(candidate_k=0), "candidate_k"),
        (lambda: LossArgs(weights={"kl": float("nan")}), "'kl'"),
        (lambda: TrainingArgs(anchor_budget="per_row"), "model.training.anchor_budget"),
    ],
)
def test_a_group_refuses_a_bad_field_when_built_naming_the_option(build, option):
    with pytest.raises(ValueError, match=option.replace(".", r"\.")):
        build()


def test_a_bad_group_field_fails_when_the_cli_builds_the_model(tmp_path):
    with pytest.raises(ValueError, match=r"model\.loss\.position_weighting"):
        cli_main(["fit", "--model.loss.position_weighting=linear", "--trainer.logger=false",
                  "--trainer.max_steps=1", f"--trainer.default_root_dir={tmp_path}"])  # fmt: skip


def test_drafter_config_is_frozen_and_replace_renormalises_it():
    config = DrafterConfig(markov_head={"kind": "gated", "rank": 0}, confidence_with_markov=False)
    assert config.markov_head is None  # rank 0 = no head
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.block_size = 4
    gated = dataclasses.replace(config, markov_head={"kind": "gated", "rank": 8})
    assert gated.markov_head == MarkovHeadConfig(kind="gated", rank=8) and config.markov_head is None
    with pytest.raises(ValueError, match="block_size must be >= 2"):  # replace validates like the constructor
        dataclasses.replace(config, block_size=1)
