"""The recipe choices of the anchor projects (configs/recipe_choices/): feature noise in training steps only, Muon on
the matrices it is given. Each test fails if its option is ignored."""

from __future__ import annotations

import pytest
import torch
from helpers.paths import ROOT

from dspark_lightning.cli import cli_main
from dspark_lightning.errors import OptionError
from dspark_lightning.lightning.config import TrainingArgs
from dspark_lightning.lightning.optim import MuonAdamW, muon_parameter, newton_schulz_float32
from dspark_lightning.machine import fast_bf16

QUICKSTART = str(ROOT / "configs/quickstart.yaml")


def built(*overlays: str):
    args = ["--config", QUICKSTART, *[a for o in overlays for a in ("--config", str(ROOT / o))]]
    args += ["--trainer.logger=false", "--trainer.callbacks=[]", "--data.seq_len=128", "--data.batch_size=1"]
    return cli_main(args, run=False)


@pytest.fixture(scope="module")
def noisy():
    cli = built("configs/recipe_choices/feature_noise.yaml")
    cli.model.configure_model()
    cli.datamodule.setup("fit")
    return cli.model, next(iter(cli.datamodule.train_dataloader()))


def drafter_calls(module, step, batch) -> list[tuple[tuple, dict, object]]:
    """Each drafter forward of one step: (its positional arguments, its keyword arguments, its output)."""
    calls = []
    original = module.drafter.forward

    def spy(*args, **kwargs):
        out = original(*args, **kwargs)
        calls.append((args, kwargs, out))
        return out

    module.drafter.forward = spy
    try:
        with torch.no_grad():
            step(batch, 0)
    finally:
        del module.drafter.forward
    return calls


def captured_features(module, step, batch) -> torch.Tensor:
    return drafter_calls(module, step, batch)[0][0][4]  # the context features of the step's one forward


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
    cli = built("configs/recipe_choices/muon.yaml", "configs/heads/gated.yaml")
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


QUINTIC = (3.4445, -4.7750, 2.0315)  # Muon's Newton-Schulz coefficients (Keller Jordan's), torch's defaults


def newton_schulz_float64(g: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """The quintic iteration X <- aX + (bA + cA^2)X, A = XX^T, on the wide orientation, in float64."""
    x = g.double().T if g.shape[0] > g.shape[1] else g.double()
    x = x / x.norm()
    a, b, c = QUINTIC
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if g.shape[0] > g.shape[1] else x


@pytest.mark.parametrize("shape", [(12, 20), (20, 12)])
def test_newton_schulz_float32_is_torchs_iteration_at_float32_precision(shape):
    from torch.optim._muon import DEFAULT_A, DEFAULT_B, DEFAULT_C, _zeropower_via_newtonschulz

    assert (DEFAULT_A, DEFAULT_B, DEFAULT_C) == pytest.approx(QUINTIC)
    g = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    reference = newton_schulz_float64(g)
    ours = newton_schulz_float32(g, QUINTIC, 5, 1e-7)
    assert ours.dtype == torch.float32 and ours.shape == g.shape
    assert torch.allclose(ours.double(), reference, atol=1e-5)
    torchs = _zeropower_via_newtonschulz(g, QUINTIC, 5, 1e-7)  # the same iteration, in bf16
    assert torch.allclose(torchs.double(), reference, atol=0.05) and not torch.allclose(
        torchs.double(), reference, atol=1e-4
    )


def test_muon_orthogonalizes_in_the_dtype_it_is_given():
    g = torch.randn(12, 20, generator=torch.Generator().manual_seed(1))
    lr, momentum = 0.1, 0.95
    expected = -lr * newton_schulz_float64((1 - momentum) * g * momentum + g * (1 - momentum))  # one Nesterov step
    moved = {}
    for dtype in ("float32", "bfloat16"):
        weight = torch.nn.Parameter(torch.zeros(12, 20))
        optimizer = MuonAdamW([("backbone.w", weight)], lr=lr, momentum=momentum, newton_schulz_dtype=dtype)
        assert optimizer.newton_schulz_dtype == dtype
        weight.grad = g.clone()
        optimizer.step()
        moved[dtype] = weight.detach().double()
    assert torch.allclose(moved["float32"], expected, atol=1e-6)
    assert not torch.allclose(moved["bfloat16"], expected, atol=1e-5)  # torch's bf16 path: the option is not ignored
    auto = MuonAdamW([("backbone.w", torch.nn.Parameter(torch.zeros(4, 4)))])
    assert auto.newton_schulz_dtype == ("bfloat16" if fast_bf16() else "float32")  # a CPU here: by its flags
    with pytest.raises(ValueError, match="newton_schulz_dtype must be auto, bfloat16 or float32, got 'fp16'"):
        MuonAdamW([("backbone.w", torch.nn.Parameter(torch.zeros(4, 4)))], newton_schulz_dtype="fp16")


def printed_config(capsys, *configs: str) -> dict:
    import yaml

    with pytest.raises(SystemExit) as exit_info:
        cli_main(["fit", *[a for c in configs for a in ("--config", str(ROOT / c))], "--print_config"])
    assert exit_info.value.code == 0
    return yaml.safe_load(capsys.readouterr().out)


def test_full_vocab_drops_the_draft_vocabulary_and_block16_sets_the_block(capsys):
    recipe = "configs/smollm2_sharegpt.yaml"
    assert printed_config(capsys, recipe)["model"]["drafter"]["draft_vocab"]  # the recipe maps Vd = 8,192 ...
    assert (
        printed_config(capsys, recipe, "configs/recipe_choices/full_vocab.yaml")["model"]["drafter"]["draft_vocab"]
        is None
    )
    module = built("configs/recipe_choices/block16.yaml").model
    assert module.drafter.block_size == 16 and module.drafter_config.block_size == 16


@pytest.fixture(scope="module")
def draft_opd():
    cli = built("configs/recipe_choices/draft_opd.yaml", "configs/heads/gated.yaml")
    cli.model.configure_model()
    cli.datamodule.setup("fit")
    return cli.model, next(iter(cli.datamodule.train_dataloader()))


@pytest.fixture(scope="module")
def draft_opd_dflash():
    """The same stage in the DFlash convention (slot 0 is the anchor's own token, never drafted)."""
    cli = cli_main(
        ["--config", QUICKSTART, "--config", str(ROOT / "configs/recipe_choices/draft_opd.yaml"), "--trainer.logger=false",
         "--trainer.callbacks=[]", "--data.seq_len=128", "--data.batch_size=1", "--model.drafter.sample_from_anchor=false"],
        run=False,
    )  # fmt: skip
    cli.model.configure_model()
    cli.datamodule.setup("fit")
    return cli.model, next(iter(cli.datamodule.train_dataloader()))


@pytest.mark.parametrize("stage", ["draft_opd", "draft_opd_dflash"])
def test_error_replay_moves_anchors_to_where_greedy_verification_first_rejects(stage, request):
    module, batch = request.getfixturevalue(stage)
    assert module.training_args.error_replay == 0.5
    first_slot = 0 if module.drafter_config.sample_from_anchor else 1  # DFlash: slot k predicts p + k, from k = 1
    (_, probe_kwargs, probe), (_, trained_kwargs, _) = drafter_calls(module, module.training_step, batch)
    assert probe_kwargs["markov_prev"] == "own"  # the probe drafts as decoding does
    # independently: the target's own next-token argmax from its full forward, the drafter's from the probe logits
    with torch.no_grad():
        target_next = module.target.model(input_ids=batch["input_ids"]).logits.argmax(-1)
    drafted = probe.logits.argmax(-1)
    sampled, moved = probe_kwargs["anchors"], trained_kwargs["anchors"]
    B, S = module.drafter_config.block_size, batch["input_ids"].shape[1]
    for row in range(batch["input_ids"].shape[0]):
        rejections = set()
        for a in range(sampled.positions.shape[1]):
            if not sampled.valid[row, a]:
                continue
            p = int(sampled.positions[row, a])
            for slot in range(first_slot, B):  # slot k predicts p + 1 + k (DSpark) or p + k (DFlash)
                q = p + slot + (1 - first_slot)
                if q >= S or not batch["loss_mask"][row, q]:
                    break
                if int(drafted[row, a, slot]) != int(target_next[row, q - 1]):
                    rejections.add(q)
                    break
        before = set(sampled.positions[row][sampled.valid[row]].tolist())
        after = set(moved.positions[row][moved.valid[row]].tolist())
        assert len(after) == len(before) and after - before <= rejections and after != before
        replayable = {q for q in rejections if q in after or q not in before}  # every rejection that was free to take
        assert len(after & rejections) >= min(round(0.5 * sampled.positions.shape[1]), len(rejections & replayable))


def test_markov_prev_own_feeds_the_drafters_own_choices_in_training_and_the_text_in_validation(draft_opd):
    module, batch = draft_opd
    _, (_, kwargs, out) = drafter_calls(module, module.training_step, batch)
    assert kwargs["markov_prev"] == "own"
    drafted = out.logits.argmax(-1)  # the drafter's choice at each slot (full vocabulary here)
    valid = out.anchors.valid
    assert torch.equal(out.prev_tokens[..., 1:][valid], drafted[..., :-1][valid])
    assert not torch.equal(out.prev_tokens[..., 1:][valid], out.target_tokens[..., :-1][valid])
    ((_, kwargs, out),) = drafter_calls(module, module.validation_step, batch)
    assert kwargs["markov_prev"] == "teacher"  # validation and test measure teacher-forced acceptance, as before
    assert torch.equal(out.prev_tokens[..., 1:][valid_v := out.anchors.valid], out.target_tokens[..., :-1][valid_v])


@pytest.mark.parametrize("bad", [{"error_replay": 1.5}, {"error_replay": -0.1}, {"markov_prev": "text"}])
def test_draft_opd_options_refuse_values_out_of_range(bad):
    with pytest.raises(OptionError, match=f"model.training.{next(iter(bad))} must be"):
        TrainingArgs(**bad)


def test_init_weights_starts_a_stage_from_a_checkpoints_drafter(tmp_path):
    source = built().model
    state = {k: v + 0.25 if v.is_floating_point() else v for k, v in source.state_dict().items()}
    for key in source.frozen_state_keys():
        state.pop(key)
    torch.save({"state_dict": state, "hyper_parameters": {}}, tmp_path / "sft.ckpt")
    stage = built().model
    stage = type(stage)(
        **{**stage.hparams, "training": {**stage.hparams["training"], "init_weights": str(tmp_path / "sft.ckpt")}}
    )
    untouched = {k: v.clone() for k, v in stage.state_dict().items()}
    stage.setup("fit")
    for key, value in stage.state_dict().items():
        assert torch.equal(value, state[key] if key in state else untouched[key]), key
    assert any(not torch.equal(state[k], untouched[k]) for k in state)  # the weights did change
    other = built("configs/heads/gated.yaml").model  # another Markov head: other tensors
    other = type(other)(
        **{**other.hparams, "training": {**other.hparams["training"], "init_weights": str(tmp_path / "sft.ckpt")}}
    )
    with pytest.raises(OptionError, match="model.training.init_weights .*does not hold this drafter's tensors"):
        other.setup("fit")
