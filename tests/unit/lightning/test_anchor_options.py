"""The anchors' recipe options (configs/anchors/): feature noise in training steps only, Muon on the matrices it is
given. Each test fails if its option is ignored."""

from __future__ import annotations

import pytest
import torch
from helpers.paths import ROOT

from dspark_lightning.cli import cli_main
from dspark_lightning.errors import OptionError
from dspark_lightning.lightning.config import TrainingArgs
from dspark_lightning.lightning.optim import MuonAdamW, muon_parameter

QUICKSTART = str(ROOT / "configs/quickstart.yaml")


def built(*overlays: str):
    args = ["--config", QUICKSTART, *[a for o in overlays for a in ("--config", str(ROOT / o))]]
    args += ["--trainer.logger=false", "--trainer.callbacks=[]", "--data.seq_len=128", "--data.batch_size=1"]
    return cli_main(args, run=False)


@pytest.fixture(scope="module")
def noisy():
    cli = built("configs/anchors/feature_noise.yaml")
    cli.model.configure_model()
    cli.datamodule.setup("fit")
    return cli.model, next(iter(cli.datamodule.train_dataloader()))


def captured_features(module, step, batch) -> torch.Tensor:
    seen = []
    original = module.drafter.forward

    def spy(*args, **kwargs):
        seen.append(args[4])  # context_features
        return original(*args, **kwargs)

    module.drafter.forward = spy
    try:
        with torch.no_grad():
            step(batch, 0)
    finally:
        del module.drafter.forward
    return seen[0]


def test_feature_noise_is_added_in_training_steps_and_never_in_validation(noisy):
    module, batch = noisy
    assert module.training_args.feature_noise_std == 0.05
    clean = module.target.features(batch["input_ids"], batch["position_ids"]).context_features
    trained = captured_features(module, module.training_step, batch)
    validated = captured_features(module, module.validation_step, batch)
    assert torch.equal(validated, clean)  # validation (and decoding, which never runs a step) sees the target as is
    difference = trained - clean
    assert 0.04 < float(difference.std()) < 0.06 and abs(float(difference.mean())) < 0.01  # std 0.05, mean 0


def test_feature_noise_std_must_be_non_negative():
    with pytest.raises(OptionError, match="model.training.feature_noise_std must be a finite number >= 0"):
        TrainingArgs(feature_noise_std=-0.1)


def test_muon_trains_the_backbone_matrices_and_adamw_the_rest():
    cli = built("configs/anchors/muon.yaml", "configs/heads/gated.yaml")
    module = cli.model
    named = [(n, p) for n, p in module.drafter.named_parameters() if p.requires_grad]
    optimizer = module.optimizer_factory(named)
    assert isinstance(optimizer, MuonAdamW)
    muon = {id(p) for group in optimizer.muon.param_groups for p in group["params"]}
    adamw = {id(p) for group in optimizer.adamw.param_groups for p in group["params"]}
    assert muon == {id(p) for n, p in named if n.startswith("backbone.") and p.ndim == 2}
    assert adamw == {id(p) for n, p in named if id(p) not in muon} and any("markov_head" in n for n, _ in named)
    assert [g["lr"] for g in optimizer.param_groups] == [0.01, 0.001]  # what a scheduler scales: both optimizers


def test_muon_updates_only_the_parameters_it_is_given():
    torch.manual_seed(0)
    model = torch.nn.ModuleDict({"backbone": torch.nn.Linear(8, 8), "head": torch.nn.Linear(8, 4)})
    frozen = torch.nn.Linear(8, 8)  # not given to the optimizer
    named = [(f"{k}.{n}", p) for k, m in model.items() for n, p in m.named_parameters()]
    assert [n for n, p in named if muon_parameter(n, p)] == ["backbone.weight"]
    optimizer = MuonAdamW(named, lr=0.05, adamw_lr=0.01)
    before = {n: p.detach().clone() for n, p in named} | {"frozen": frozen.weight.detach().clone()}
    loss = model["head"](frozen(model["backbone"](torch.randn(4, 8)))).square().sum()
    loss.backward()
    optimizer.step()
    assert all(not torch.equal(before[n], p) for n, p in named)  # every given parameter moved (Muon or AdamW)
    assert torch.equal(before["frozen"], frozen.weight) and frozen.weight.grad is not None  # not given: unchanged
    state = optimizer.state_dict()
    optimizer.load_state_dict(state)  # checkpoints round-trip both inner optimizers
    assert len(optimizer.state) == len(named)


def printed_config(capsys, *configs: str) -> dict:
    import yaml

    with pytest.raises(SystemExit) as exit_info:
        cli_main(["fit", *[a for c in configs for a in ("--config", str(ROOT / c))], "--print_config"])
    assert exit_info.value.code == 0
    return yaml.safe_load(capsys.readouterr().out)


def test_full_vocab_drops_the_draft_vocabulary_and_block16_sets_the_block(capsys):
    recipe = "configs/smollm2_sharegpt.yaml"
    assert printed_config(capsys, recipe)["model"]["drafter"]["draft_vocab"]  # the recipe maps Vd = 8,192 ...
    assert printed_config(capsys, recipe, "configs/anchors/full_vocab.yaml")["model"]["drafter"]["draft_vocab"] is None
    module = built("configs/anchors/block16.yaml").model
    assert module.drafter.block_size == 16 and module.drafter_config.block_size == 16
