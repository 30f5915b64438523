"""Speculative decoding on a target with sliding-window layers: a tiny random Gemma 3 (window 8, full attention on
the last of its 6 layers) with prompts longer than the window and generations that cross it.

Verify forwards of up to 9 tokens push entries out of the window and rejections crop them again
(``decoding.target_cache``, ``docs/design/design.md §8.6``). Everything is checked against computations that never crop a
cache: the target's own ``generate``, a full forward over the whole text without a cache, and the exact float64 law
of a full forward.
"""

from __future__ import annotations

import copy

import pytest
import torch
from helpers.drafters import oracle_drafts
from helpers.law import law_pvalue
from helpers.targets import GEMMA3_MASK_ID, greedy_reference, make_tiny_gemma3

from dspark_lightning.decoding import speculative_generate
from dspark_lightning.decoding.target_cache import TargetCache
from dspark_lightning.decoding.target_forwards import TargetForwards
from dspark_lightning.measuring.identity import check_identity
from dspark_lightning.models import DrafterConfig, DSparkDrafter, FrozenTarget, MarkovHeadConfig

WINDOW = 8
NEW_TOKENS = 40


@pytest.fixture(scope="module")
def gemma():
    """The target, a 12-token prompt (longer than the window) and its greedy text, long enough for every block."""
    model = make_tiny_gemma3(sliding_window=WINDOW)
    target = FrozenTarget(model, target_layer_ids=[1, 4])
    prompt = torch.randint(5, model.config.vocab_size, (1, 12), generator=torch.Generator().manual_seed(1))
    text = greedy_reference(model, prompt, NEW_TOKENS + 10, eos=[])[0].tolist()
    return model, target, prompt, text


def random_drafter(target, block_size: int, seed: int = 0, **config) -> DSparkDrafter:
    """An untrained drafter (random weights, gated head)."""
    cfg = DrafterConfig(
        block_size=block_size, num_layers=1, mask_token_id=GEMMA3_MASK_ID, markov_head=MarkovHeadConfig("gated", 8),
        **config,
    )  # fmt: skip
    torch.manual_seed(seed)
    drafter = DSparkDrafter.for_target(cfg, target).eval()
    with torch.no_grad():
        for p in drafter.parameters():
            if p.requires_grad:
                p.normal_(0.0, 0.3)
    return drafter


def decode(target, drafter, prompt, kind: str, **kwargs):
    mode = "markov" if kind == "random" else "parallel"  # the oracles draft the argmax of their base logits
    return speculative_generate(target, drafter, prompt, NEW_TOKENS, mode=mode, eos_token_id=[], **kwargs)


def drafter_of(kind: str, target, text: list[int], block_size: int) -> DSparkDrafter:
    if kind == "random":
        return random_drafter(target, block_size)
    # two wrong drafts in every 11 positions: 11 is prime to every step length here, so the rejections fall on
    # varied slots of the blocks
    wrong = (lambda position: position % 11 in (0, 4)) if kind == "noisy_oracle" else (lambda position: False)
    return oracle_drafts(random_drafter(target, block_size), text, wrong)


def test_the_window_changes_the_target(gemma):
    """The fixture can tell a wrong window: the same weights with the window wider than the text decode otherwise."""
    model, _, prompt, text = gemma
    wide = copy.deepcopy(model)
    wide.config.sliding_window = 4 * len(text)
    for layer in wide.model.layers:
        layer.self_attn.sliding_window = wide.config.sliding_window
    assert not torch.equal(
        greedy_reference(wide, prompt, NEW_TOKENS, eos=[]), greedy_reference(model, prompt, NEW_TOKENS, eos=[])
    )


@pytest.mark.parametrize("block_size", [2, 4, 8])  # verify forwards of 3, 5 and 9 tokens (9 > the window)
@pytest.mark.parametrize("kind", ["random", "noisy_oracle", "oracle"])
def test_greedy_output_equals_generate_across_the_window(gemma, block_size, kind):
    model, target, prompt, text = gemma
    drafter = drafter_of(kind, target, text, block_size)
    out, stats = decode(target, drafter, prompt, kind)
    assert torch.equal(out, greedy_reference(model, prompt, NEW_TOKENS, eos=[])), (kind, block_size)
    accepted = stats.accepted_per_step
    if kind == "oracle":  # whole blocks accepted: every verify forward moves the window by block_size + 1
        assert accepted == [block_size] * len(accepted)
    elif kind == "noisy_oracle":  # rejections after varied numbers of accepted drafts
        assert len(set(accepted)) > 1 and min(accepted) < block_size, accepted
    else:  # rejections (mostly of the first draft: the whole rest of each verify block is cropped)
        assert min(accepted) < block_size, accepted


def test_verify_forwards_equal_a_full_forward_over_the_text(gemma, monkeypatch):
    """Every row of every verify forward (logits and the drafter's features), rejected drafts included, equals a
    forward over prefix + block without a cache."""
    model, target, prompt, text = gemma
    drafter = drafter_of("noisy_oracle", target, text, 8)
    forwards = []
    verify = TargetForwards.verify

    def recording(self, tokens, start):
        logits, features = verify(self, tokens, start)
        rows = torch.stack([logits[i] for i in range(tokens.shape[1])])
        forwards.append((tokens[0].tolist(), start, rows, features[0]))
        return logits, features

    monkeypatch.setattr(TargetForwards, "verify", recording)
    out, stats = decode(target, drafter, prompt, "noisy_oracle")
    assert len(forwards) == len(stats.accepted_per_step) >= 5 and sum(stats.accepted_per_step) > 0
    output = out[0].tolist()
    for tokens, start, rows, features in forwards:
        ids = torch.tensor([output[:start] + tokens])
        with torch.no_grad():
            full = model(input_ids=ids, use_cache=False, output_hidden_states=True)
        # float32 summation order only (measured: <= 3e-7 on logits of size 0.4, 5e-6 on features of size 8)
        torch.testing.assert_close(rows, full.logits[0, start:], rtol=1e-5, atol=1e-5)
        reference = torch.cat([full.hidden_states[i + 1][0, start:] for i in target.target_layer_ids], dim=-1)
        torch.testing.assert_close(features, reference, rtol=1e-5, atol=5e-5)


@pytest.mark.parametrize("kind, block_size", [("oracle", 4), ("noisy_oracle", 8)])
def test_sliding_layers_hold_only_the_window(gemma, monkeypatch, kind, block_size):
    """As in ``generate``'s cache: after every step a sliding layer holds the last W - 1 tokens (during a verify
    forward at most W - 1 + n + 1), a full layer every token; also after steps that accepted the whole block."""
    model, target, prompt, text = gemma
    drafter = drafter_of(kind, target, text, block_size)
    sizes = []
    verify, crop = TargetForwards.verify, TargetForwards.crop

    def held(self):
        return [(layer.is_sliding, layer.keys.shape[-2]) for layer in self.cache.layers]

    def recording_verify(self, tokens, start):
        result = verify(self, tokens, start)
        sizes.append(("verify", start + tokens.shape[1], tokens.shape[1], held(self)))
        return result

    def recording_crop(self, length):
        crop(self, length)
        sizes.append(("crop", length, 0, held(self)))

    monkeypatch.setattr(TargetForwards, "verify", recording_verify)
    monkeypatch.setattr(TargetForwards, "crop", recording_crop)
    out, stats = decode(target, drafter, prompt, kind)
    assert torch.equal(out, greedy_reference(model, prompt, NEW_TOKENS, eos=[]))
    steps = len(stats.accepted_per_step)
    assert [event for event, *_ in sizes] == ["verify", "crop"] * steps  # a crop after every verify forward
    if kind == "oracle":
        assert stats.accepted_per_step == [block_size] * steps and steps >= 7  # nothing ever rejected
    for event, length, block, layers in sizes:
        assert [sliding for sliding, _ in layers] == [t == "sliding_attention" for t in model.config.layer_types]
        for sliding, entries in layers:
            if not sliding:
                assert entries == length, (event, length, layers)
            elif event == "crop":
                assert entries == min(length, WINDOW - 1), (event, length, layers)
            else:
                assert entries <= WINDOW - 1 + block, (event, length, layers)


def test_without_a_rollback_mode_every_layer_keeps_the_whole_prefix(gemma, monkeypatch):
    """A transformers whose sliding layer cannot record its past: the cache falls back to full layers (the
    out-of-window keys masked instead of dropped), still lossless."""
    from transformers.cache_utils import DynamicSlidingWindowLayer

    model, target, prompt, text = gemma
    monkeypatch.delattr(DynamicSlidingWindowLayer, "activate_past_recording")
    cache = TargetCache(model)
    assert not cache.rollback and not any(layer.is_sliding for layer in cache.cache.layers)
    out, stats = decode(target, drafter_of("noisy_oracle", target, text, 8), prompt, "noisy_oracle")
    assert torch.equal(out, greedy_reference(model, prompt, NEW_TOKENS, eos=[]))
    assert min(stats.accepted_per_step) < 8


def test_cropping_past_the_end_is_refused(gemma):
    _, target, prompt, _ = gemma
    forwards = TargetForwards(target, random_drafter(target, 4))
    with torch.no_grad():
        forwards.prefill(prompt)
    with pytest.raises(ValueError, match="cannot crop the target's KV cache to 13 tokens: it covers 12"):
        forwards.crop(13)


def test_sampling_keeps_the_target_law():
    """Joint law of new tokens 2 and 3 under speculative sampling == the target's exact law, computed by full float64
    forwards without a cache (chi-square). The 6-token prompt fills the window of 4 and every verify forward (4 tokens)
    pushes entries out; rejections then crop them."""
    V, T = 8, 1.0
    model = make_tiny_gemma3(vocab_size=V, num_layers=2, sliding_window=4, seed=3)
    with torch.no_grad():  # logits 20x sharper (Gemma's final norm scales by 1 + weight): a random init's are
        model.model.norm.weight.fill_(19.0)  # almost uniform, and a law that hardly depends on the context tests little
    target = FrozenTarget(model, target_layer_ids=[0])
    drafter = random_drafter(target, block_size=3, seed=1)
    prompt = torch.tensor([[2, 7, 5, 3, 6, 1]])
    exact64 = copy.deepcopy(model).double()
    pairs = torch.cartesian_prod(torch.arange(V), torch.arange(V))  # (x1, x2) for every continuation
    with torch.no_grad():
        logits = exact64(torch.cat((prompt.expand(V * V, -1), pairs), dim=1), use_cache=False).logits
    p = torch.softmax(logits[:, -3:] / T, dim=-1)  # P(x1 | prompt), P(x2 | prompt, x1), P(x3 | prompt, x1, x2)
    joint = p[:, 0, :].gather(1, pairs[:, :1])[:, 0] * p[:, 1, :].gather(1, pairs[:, 1:])[:, 0]  # P(x1, x2)
    exact = torch.zeros(V, V, dtype=torch.float64)  # P(x2 = b, x3 = c)
    exact.index_add_(0, pairs[:, 1], joint[:, None] * p[:, 2, :])
    g = torch.Generator().manual_seed(5)
    counts = torch.zeros(V * V)
    steps = []  # accepted drafts per verify forward, per trial
    for _ in range(1000):
        out, stats = speculative_generate(
            target, drafter, prompt, 3, mode="parallel", temperature=T, generator=g, eos_token_id=[]
        )
        x2, x3 = out[0, -2:].tolist()
        counts[x2 * V + x3] += 1
        steps.append(stats.accepted_per_step)
    assert {s[0] for s in steps} >= {0, 1, 2}  # the first block rejected after 0, 1 and 2 accepted drafts
    assert sum(len(s) > 1 for s in steps) > len(steps) // 3  # often a token came from a forward after a crop
    assert law_pvalue(counts, exact.flatten()) > 1e-3  # fixed seeds: deterministic; 1e-3 guards against a wrong law


def memorising_drafter(target, text: list[int], block_size: int = 4) -> DSparkDrafter:
    """A vanilla Markov head that knows two successors out of three of ``text`` (a bigram oracle of it): blocks are
    accepted in part, so the anchors of the decode are irregular."""
    V = target.vocab_size
    cfg = DrafterConfig(
        block_size=block_size, num_layers=1, mask_token_id=GEMMA3_MASK_ID, markov_head=MarkovHeadConfig(rank=V),
        confidence_head=False, confidence_with_markov=False,
    )  # fmt: skip
    torch.manual_seed(0)
    drafter = DSparkDrafter.for_target(cfg, target).eval()
    w2 = torch.zeros(V, V)
    for i, (a, b) in enumerate(zip(text, text[1:])):
        if i % 3 != 2:
            w2[b, a] += 30.0
    with torch.no_grad():
        drafter.markov_head.markov_w1.weight.copy_(torch.eye(V))
        drafter.markov_head.markov_w2.weight.copy_(w2)
    return drafter


@pytest.mark.parametrize("block_size", [4, 8])
def test_training_forward_reproduces_greedy_decoding(gemma, block_size):
    """The train/serve identity (``measuring.identity``) on the sliding-window target: the training forward over the
    whole text, anchored where the decode anchored, drafts the decode's blocks and reaches its tau."""
    _, target, prompt, text = gemma
    drafter = memorising_drafter(target, text, block_size)
    result = check_identity(target, drafter, prompt[0].tolist(), NEW_TOKENS, "markov", eos_token_id=[])
    assert result.ok, result
    assert 1.0 < result.measured_tau < block_size + 1 and result.steps > 3, result


def test_head_rows_are_only_those_verification_reads(gemma):
    """Gemma 3's tied LM head runs on the rows verification reads only; the output is ``generate``'s."""
    model, target, prompt, text = gemma
    drafter = drafter_of("noisy_oracle", target, text, 8)  # drafts without the LM head: the hook sees the target only
    rows = []
    hook = model.lm_head.register_forward_hook(lambda _m, args, _o: rows.append(args[0].shape[:-1].numel()))
    try:
        out, stats = decode(target, drafter, prompt, "noisy_oracle")
    finally:
        hook.remove()
    assert torch.equal(out, greedy_reference(model, prompt, NEW_TOKENS, eos=[]))
    read = sum(a + 1 for a in stats.accepted_per_step)  # rows up to and including the first rejection
    verified = sum(n + 1 for n in stats.verified_per_step)
    assert read < verified
    assert sum(rows) == 2 + read  # + the prompt's last row and the prefill's check of the head against it
