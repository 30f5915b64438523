"""The architecture matrix (``helpers.architecture_matrix``): for every family, a tiny random target saved and loaded
the way ``fit`` loads it, packed features equal to running each document alone, three training steps of the project's
own step, then greedy decoding equal to the target's own ``generate`` in every mode."""

from __future__ import annotations

import pytest
import torch
from helpers.architecture_matrix import FAMILIES, MASK_ID, VOCAB
from helpers.drafters import packed_batch
from helpers.targets import greedy_reference

from dspark_lightning.decoding import speculative_generate
from dspark_lightning.lightning.config import TargetArgs
from dspark_lightning.lightning.module import DSparkModule
from dspark_lightning.models import DrafterConfig, MarkovHeadConfig

PROMPTS = [[1, 5, 9, 3, 7, 2], [11, 4, 4, 20, 8, 30, 6, 12, 9]]
NEW_TOKENS = 20  # prompt + new tokens cross the sliding windows (8)


def _module(folder) -> DSparkModule:
    drafter = DrafterConfig(
        block_size=4, num_layers=1, max_anchors=4, mask_token_id=MASK_ID,
        markov_head=MarkovHeadConfig(kind="gated", rank=8), confidence_with_markov=True,
    )  # fmt: skip
    torch.manual_seed(1)
    return DSparkModule(target=TargetArgs(path=str(folder), dtype="float32"), drafter=drafter)


def _assert_packing_keeps_documents_apart(module, batch) -> None:
    """The features of a packed row equal the target run on each document alone (its own decoder, by hand)."""
    target = module.target
    packed = target.features(batch["input_ids"], batch["position_ids"])
    body = getattr(target.model, target.model.base_model_prefix)
    for doc in range(int(batch["document_ids"].max()) + 1):
        span = (batch["document_ids"][0] == doc).nonzero().flatten()
        alone = body(input_ids=batch["input_ids"][:1, span], use_cache=False, output_hidden_states=True)
        torch.testing.assert_close(packed.final_hidden[0, span], alone.last_hidden_state[0], rtol=1e-4, atol=1e-4)


def _train(module, batch, steps: int = 3) -> None:
    trainable = [p for p in module.drafter.parameters() if p.requires_grad]
    before = [p.detach().clone() for p in trainable]
    optimizer = torch.optim.AdamW(trainable, lr=1e-2)
    module.drafter.train()
    for step in range(steps):
        out = module.shared_step(batch, torch.Generator().manual_seed(step))
        assert torch.isfinite(out.loss)
        optimizer.zero_grad()
        out.loss.backward()
        optimizer.step()
    module.drafter.eval()
    assert any(not torch.equal(a, b) for a, b in zip(before, trainable, strict=True))


@pytest.mark.parametrize("family", FAMILIES, ids=[f.name.replace(" ", "_") for f in FAMILIES])
def test_family_trains_and_decodes_equal_to_generate(family, tmp_path):
    family.build().save_pretrained(tmp_path)
    module = _module(tmp_path)  # loads it as fit does, through the support check
    ids, loss_mask, documents, positions = packed_batch(lengths=(14, 10), pad=4, vocab=VOCAB - 2)
    batch = {"input_ids": ids, "loss_mask": loss_mask, "document_ids": documents, "position_ids": positions}
    with torch.no_grad():
        _assert_packing_keeps_documents_apart(module, batch)
    _train(module, batch)
    model = module.target.model
    for prompt in PROMPTS:
        prompt = torch.tensor([prompt])
        expected = greedy_reference(model, prompt, NEW_TOKENS, eos=None)
        for mode in ("parallel", "markov", "selector"):
            out, _ = speculative_generate(
                module.target, module.drafter, prompt, NEW_TOKENS, mode=mode, k=4, eos_token_id=[]
            )
            assert out.tolist() == expected.tolist(), (family.name, mode, prompt.tolist())
