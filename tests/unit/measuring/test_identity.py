"""Train/serve identity: the training forward, anchored where greedy decoding anchored and fed the drafter's own
previous tokens, drafts the decoding loop's blocks token for token and reaches its measured tau exactly."""

from __future__ import annotations

import itertools

import pytest
import torch
from helpers.paths import ROOT

from dspark_lightning.measuring.gap import gap_decomposition, gap_markdown
from dspark_lightning.measuring.identity import (
    check_identity,
    greedy_continuation,
    record_decode,
    teacher_forced_blocks,
)
from dspark_lightning.models import DrafterConfig, DSparkDrafter, FrozenTarget, MarkovHeadConfig
from dspark_lightning.models.vocab import DraftVocab

HEADS = {
    "none": None,
    "vanilla": MarkovHeadConfig(rank=8),
    "gated": MarkovHeadConfig("gated", 8),
    "selector": MarkovHeadConfig.selector(8),
    "rnn": MarkovHeadConfig("rnn", 8),
}
NEW_TOKENS = 24


def modes_of(head: str) -> list[str]:
    return {"none": ["parallel"], "rnn": ["markov"]}.get(head, ["markov", "selector"])


@pytest.fixture(scope="module")
def demo():
    from transformers import AutoTokenizer

    path = ROOT / "assets/demo-target"
    target = FrozenTarget.from_pretrained(str(path), target_layer_ids=[1, 3])
    tokenizer = AutoTokenizer.from_pretrained(path)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "How do I keep bread fresh?"}], add_generation_prompt=True, return_dict=False
    )
    text = greedy_continuation(target, prompt, NEW_TOKENS + 8)
    return target, prompt, text


def make_drafter(
    target, head: str, sample_from_anchor: bool, draft_vocab: bool, text: list[int], seed: int = 0, **extra
):
    """An untrained drafter with random weights; a vanilla head is made a (memorising) bigram oracle of ``text``, so
    that blocks are accepted in part and the anchors the identity must follow are irregular."""
    V = target.vocab_size
    gen = torch.Generator().manual_seed(seed)
    oracle = head == "vanilla"
    vocab = None
    if draft_vocab:  # half the vocabulary, random; the oracle's also holds most of the text's tokens
        chosen = set(torch.randperm(V, generator=gen)[: V // 2].tolist())
        if oracle:
            chosen |= set(text)
        chosen -= set(text[-NEW_TOKENS::7])  # some target tokens cannot be drafted: rejected, however scored
        vocab = DraftVocab(torch.tensor(sorted(chosen)), V)
    config = HEADS[head] if not oracle else MarkovHeadConfig(rank=V)
    cfg = DrafterConfig(
        block_size=4,
        mask_token_id=5,
        markov_head=config,
        sample_from_anchor=sample_from_anchor,
        confidence_head=False,
        confidence_with_markov=False,
        **extra,
    )
    torch.manual_seed(seed)  # the drafter's initialisation draws from the global generator
    drafter = DSparkDrafter.for_target(cfg, target, vocab).eval()
    with torch.no_grad():
        for p in drafter.backbone.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
        head_module = drafter.markov_head
        if head_module is not None:
            for p in head_module.parameters():  # W2 starts at zero: give every head a bias that matters
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))
        if oracle:
            head_module.markov_w1.weight.copy_(torch.eye(V))
            w2 = torch.zeros(drafter.draft_vocab_size, V)
            rows = torch.arange(V) if vocab is None else torch.cumsum(vocab.t2d.long(), 0) - 1  # target -> draft index
            for i, (a, b) in enumerate(zip(text, text[1:])):
                if i % 3 != 2 and (vocab is None or vocab.t2d[b]):  # every third successor unknown: rejections
                    w2[rows[b], a] += 30.0
            head_module.markov_w2.weight.copy_(w2)
    return drafter


CASES = [(head, sfa, dv) for head, sfa, dv in itertools.product(HEADS, (True, False), (False, True))]


@pytest.mark.parametrize(("head", "sample_from_anchor", "draft_vocab"), CASES)
def test_training_forward_reproduces_greedy_decoding(demo, head, sample_from_anchor, draft_vocab):
    target, prompt, text = demo
    drafter = make_drafter(target, head, sample_from_anchor, draft_vocab, text)
    for mode in modes_of(head):
        # EOS disabled: the demo target answers briefly, and more steps test more anchors
        result = check_identity(target, drafter, prompt, NEW_TOKENS, mode, k=8, eos_token_id=[])
        assert result.steps > 0
        assert result.blocks_equal, (mode, result.first_mismatch)
        assert result.teacher_forced_tau == result.measured_tau, mode
        assert result.metric_greedy_tau == result.measured_tau, mode  # the training metric, same blocks
        if head == "vanilla" and mode == "markov":  # the oracle is accepted in part: irregular anchors
            assert 1.0 < result.measured_tau < drafter.block_size + 1 - drafter.config.first_trained_slot


def test_identity_with_sliding_window_layers(demo):
    """A window shorter than the prompt: decoding reads the cache's last W positions, training masks i < p - W."""
    target, prompt, text = demo
    drafter = make_drafter(
        target,
        "vanilla",
        True,
        False,
        text,
        num_layers=2,
        sliding_window=6,
        layer_types=["sliding_attention", "full_attention"],
    )
    result = check_identity(target, drafter, prompt, NEW_TOKENS, "markov", eos_token_id=[])
    assert result.ok and result.steps > 0 and result.measured_tau > 1.0, result


def test_identity_fails_when_the_replay_drifts(demo):
    """The check can fail: anchors one token late, or the text's previous tokens instead of the drafter's own."""
    target, prompt, text = demo
    drafter = make_drafter(target, "vanilla", True, False, text)
    record = record_decode(target, drafter, prompt, NEW_TOKENS, "markov")
    exact = teacher_forced_blocks(target, drafter, record.text, record.anchor_positions, len(prompt), "markov")
    assert exact.drafted.tolist() == record.drafted and exact.accepted == record.accepted
    late = teacher_forced_blocks(
        target, drafter, record.text, [p + 1 for p in record.anchor_positions], len(prompt), "markov"
    )
    assert late.drafted.tolist() != record.drafted
    teacher = teacher_forced_blocks(
        target, drafter, record.text, record.anchor_positions, len(prompt), "markov", markov_prev="teacher"
    )
    # the text's previous tokens are the target's: they help exactly where the drafter's own choice was rejected
    assert teacher.drafted.tolist() != record.drafted and teacher.tau >= exact.tau


def test_gap_steps_end_at_measured_tau(demo):
    """(d) is the measured tau; with the target's own reply as the "validation text", (a) is (b)."""
    target, prompt, text = demo
    drafter = make_drafter(target, "vanilla", True, False, text)
    n = 16
    reference = greedy_continuation(target, prompt, n + drafter.block_size + 1)
    mask = [False] * len(prompt) + [True] * (len(reference) - len(prompt))
    result = gap_decomposition(target, drafter, [prompt], [(reference, mask)], n, eos_token_id=[])
    tau, blocks = result["tau"], result["blocks"]
    assert tau["d"] == tau["measured"] and blocks["d"] == blocks["measured"]
    assert tau["a"] == tau["b"] and blocks["a"] == blocks["b"] == n  # stride 1: every reply position
    assert tau["c"] == tau["b"]  # greedy tau: own and text previous tokens agree up to the first rejection
    assert 1.0 <= result["harmonic_c"] <= tau["c"]
    assert 1.0 < tau["measured"]
    table = gap_markdown(result)
    assert table.count("\n| (") == 4 and f"{tau['measured']:.3f} | +0.000 |" in table


def test_identity_on_smollm2(smollm2_target, monkeypatch):
    from transformers import AutoTokenizer

    directory, _ = smollm2_target
    target = FrozenTarget.from_pretrained(str(directory), target_layer_ids=[2, 15, 27])
    tokenizer = AutoTokenizer.from_pretrained(directory)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Name three rivers."}], add_generation_prompt=True, return_dict=False
    )
    torch.manual_seed(0)
    cfg = DrafterConfig(
        block_size=4,
        mask_token_id=tokenizer.mask_token_id,
        markov_head=MarkovHeadConfig("gated", 16),
        num_heads=3,
        num_kv_heads=1,
        head_dim=64,
        intermediate_size=256,
    )
    drafter = DSparkDrafter.for_target(cfg, target).eval()
    with torch.no_grad():
        drafter.markov_head.markov_w2.weight.normal_(0, 0.5)
    result = check_identity(target, drafter, prompt, 16, "markov", k=8)
    assert result.ok, result
