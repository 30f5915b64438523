"""A saved tiny verifier, drafters on it with every Markov head, fixed outputs to compare, and a trained checkpoint."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from dspark_lightning.models import DrafterConfig, DraftVocab, DSparkDrafter, MarkovHeadConfig
from helpers.paths import ASSETS
from helpers.targets import make_tiny_gemma3, make_tiny_qwen3

V, H, B, RANK = 64, 32, 4, 8


HEADS = {
    "none": None,
    "vanilla": MarkovHeadConfig(rank=RANK),
    "gated": MarkovHeadConfig("gated", RANK),
    "gated_hidden_sigmoid": MarkovHeadConfig("gated", RANK, gate_input="hidden"),
    "selector": MarkovHeadConfig.selector(RANK),
    "rnn": MarkovHeadConfig("rnn", RANK),
}


def save_verifier(path: Path) -> Path:
    make_tiny_qwen3(vocab_size=V, hidden_size=H, num_layers=4, seed=0).save_pretrained(path)
    return path


def draft_vocab(size: int = 40) -> DraftVocab:
    return DraftVocab(torch.randperm(V - 1, generator=torch.Generator().manual_seed(7))[:size], V)


def make_drafter(target, head="vanilla", vocab=None, seed=1, **overrides) -> DSparkDrafter:
    config = dict(block_size=B, num_layers=2, max_anchors=4, mask_token_id=V - 1, target_layer_ids=[1, 2])
    config |= dict(markov_head=HEADS[head], confidence_with_markov=HEADS[head] is not None) | overrides
    drafter = DSparkDrafter.for_target(DrafterConfig(**config), target, vocab)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in drafter.named_parameters():
            if param.requires_grad:
                offset = 1.0 if name.endswith("norm.weight") else 0.0
                param.copy_(offset + 0.3 * torch.randn(param.shape, generator=generator))
    return drafter.eval()


@torch.no_grad()
def outputs(drafter, target) -> dict[str, torch.Tensor]:
    """Drafter outputs on a fixed packed batch with fixed anchors (two documents per row)."""
    generator = torch.Generator().manual_seed(5)
    ids = torch.randint(0, V - 1, (2, 24), generator=generator)
    position_ids = torch.cat((torch.arange(14), torch.arange(10))).repeat(2, 1)
    documents = torch.cat((torch.zeros(14), torch.ones(10))).long().repeat(2, 1)
    features = target.features(ids, position_ids)
    out = drafter(
        ids,
        torch.ones_like(ids),
        documents,
        position_ids,
        features.context_features,
        features.final_hidden,
        generator=torch.Generator().manual_seed(3),
    )
    assert out.anchors.valid.all()
    return {"logits": out.logits, "base": out.base_logits, "confidence": out.confidence_logits}


def with_demo_tokenizer(path: Path) -> Path:
    """Copy the demo tokenizer (2048 ids) and chat template into the saved model directory ``path``."""
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(ASSETS / "demo-target" / name, path / name)
    return path


def make_target_dir(path: Path, seed: int = 0, head_dim: int = 8) -> Path:
    """A tiny random Qwen3 with the demo tokenizer (its 2048-token vocabulary), saved for ``DSparkModule``."""
    make_tiny_qwen3(vocab_size=2048, hidden_size=32, num_layers=4, seed=seed, head_dim=head_dim).save_pretrained(path)
    return with_demo_tokenizer(path)


def save_gemma_verifier(path: Path, **gemma) -> object:
    """A tiny random Gemma 3 over the demo tokenizer's 2048 ids (``make_tiny_gemma3(**gemma)``), saved with that
    tokenizer as a target directory at ``path``; returns the model."""
    model = make_tiny_gemma3(vocab_size=2048, **gemma)
    model.save_pretrained(path)
    with_demo_tokenizer(path)
    return model


def train_and_checkpoint(tmp_path: Path, target_dir: Path, **drafter_fields) -> tuple[Path, object]:
    """Two optimizer steps of a small DSparkModule on the demo conversations; returns (checkpoint, module)."""
    import lightning as L

    from dspark_lightning.data.datamodule import ShareGPTDataModule
    from dspark_lightning.lightning.config import TargetArgs
    from dspark_lightning.lightning.module import DSparkModule

    data = str(ASSETS / "data" / "sharegpt" / "validation-00000.jsonl")
    dm = ShareGPTDataModule(str(target_dir), data, data, seq_len=128, batch_size=2, block_size=B, shuffle_buffer=0)
    drafter = DrafterConfig(block_size=B, max_anchors=8, mask_token_id=dm.mask_token_id, **drafter_fields)
    module = DSparkModule(TargetArgs(str(target_dir)), drafter)
    trainer = L.Trainer(
        max_steps=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        accelerator="cpu",
    )
    trainer.fit(module, dm)
    ckpt = tmp_path / "last.ckpt"
    trainer.save_checkpoint(ckpt)
    return ckpt, module
