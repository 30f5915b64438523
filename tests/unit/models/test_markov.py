"""Markov and confidence heads against hand-written float64 formulas."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dspark_lightning.models import ConfidenceHead, MarkovHead, MarkovHeadConfig

V, VD, R, H = 40, 30, 6, 10
VARIANTS = [
    dict(kind="vanilla"),
    dict(kind="gated", gate_input="hidden+prev", gate_activation="sigmoid"),
    dict(kind="gated", gate_input="hidden", gate_activation="sigmoid"),
    dict(kind="gated", gate_input="hidden", gate_activation="identity"),
    dict(kind="rnn"),
]


def make_head(seed=0, **kwargs) -> MarkovHead:
    torch.manual_seed(seed)
    head = MarkovHead(verifier_vocab_size=V, draft_vocab_size=VD, rank=R, hidden_size=H, **kwargs).double()
    for p in head.parameters():
        torch.nn.init.normal_(p, std=0.5)
    return head


def inputs(seed=1, n=3, b=5):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, V, (n, b), generator=g), torch.randn(n, b, H, generator=g, dtype=torch.float64)


def test_vanilla_bias_is_w2t_w1_by_hand():
    head = make_head(kind="vanilla")
    prev, hidden = inputs()
    bias = head.block_bias(prev, hidden)
    W1, W2 = head.markov_w1.weight, head.markov_w2.weight.T  # W2 is [r, Vd]
    for n in range(prev.shape[0]):
        for k in range(prev.shape[1]):
            expected = torch.zeros(VD, dtype=torch.float64)
            for v in range(VD):
                expected[v] = sum(W1[prev[n, k], i] * W2[i, v] for i in range(R))
            torch.testing.assert_close(bias[n, k], expected)


def test_gated_hidden_prev_formula_by_hand():
    head = make_head(kind="gated")
    prev, hidden = inputs()
    bias = head.block_bias(prev, hidden)
    Wg, bg = head.gate_proj.weight, head.gate_proj.bias
    for n in range(prev.shape[0]):
        for k in range(prev.shape[1]):
            e = head.markov_w1.weight[prev[n, k]]
            g = 1 / (1 + torch.exp(-(Wg[:, :H] @ hidden[n, k] + Wg[:, H:] @ e + bg)))
            torch.testing.assert_close(bias[n, k], head.markov_w2.weight @ (e * g))


def test_dflash2_form_has_no_gate_bias_and_is_linear_in_hidden():
    head = make_head(kind="gated", gate_input="hidden", gate_activation="identity")
    assert head.gate_proj.bias is None and head.gate_proj.in_features == H
    prev, hidden = inputs()
    bias = head.block_bias(prev, hidden)
    e = head.markov_w1.weight[prev]
    expected = torch.einsum("vr,nkr->nkv", head.markov_w2.weight, e * (hidden @ head.gate_proj.weight.T))
    torch.testing.assert_close(bias, expected)


@pytest.mark.parametrize("gate_input", ["hidden+prev", "hidden"])
def test_gate_forced_to_one_equals_vanilla(gate_input):
    gated = make_head(kind="gated", gate_input=gate_input)
    vanilla = make_head(kind="vanilla")
    vanilla.markov_w1.weight.data.copy_(gated.markov_w1.weight)
    vanilla.markov_w2.weight.data.copy_(gated.markov_w2.weight)
    gated.gate_proj.weight.data.zero_()
    gated.gate_proj.bias.data.fill_(40.0)  # sigmoid(40) == 1.0 exactly in float64
    prev, hidden = inputs()
    assert torch.equal(gated.gate(hidden, gated.markov_w1(prev)), torch.ones(*prev.shape, R, dtype=torch.float64))
    torch.testing.assert_close(gated.block_bias(prev, hidden), vanilla.block_bias(prev, hidden), rtol=0, atol=0)


def test_rnn_state_recursion_step_by_step():
    head = make_head(kind="rnn")
    prev, hidden = inputs()
    bias = head.block_bias(prev, hidden)
    Wj, bj = head.joint_proj.weight, head.joint_proj.bias
    for n in range(prev.shape[0]):
        s = torch.zeros(R, dtype=torch.float64)
        for k in range(prev.shape[1]):
            e = head.markov_w1.weight[prev[n, k]]
            z = Wj @ torch.cat((s, e, hidden[n, k])) + bj
            gate, cand, out = z[:R], z[R : 2 * R], z[2 * R :]
            sig = 1 / (1 + torch.exp(-gate))
            expected = head.markov_w2.weight @ torch.tanh(out)
            s = sig * s + (1 - sig) * torch.tanh(cand)
            torch.testing.assert_close(bias[n, k], expected)


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(v.values()))
def test_block_bias_equals_stacked_step_bias(variant):
    head = make_head(**variant)
    prev, hidden = inputs(seed=3)
    state, steps = None, []
    for k in range(prev.shape[1]):
        bias, state = head.step_bias(prev[:, k], hidden[:, k], state)
        steps.append(bias)
        assert (state is None) == (variant["kind"] != "rnn")
    torch.testing.assert_close(head.block_bias(prev, hidden), torch.stack(steps, 1), rtol=0, atol=1e-12)


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(v.values()))
def test_add_block_bias_adds_the_block_bias_and_its_gradients(variant):
    head = make_head(**variant)
    prev, hidden = inputs(seed=4)
    logits = torch.randn(*prev.shape, VD, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    fused, plain = logits.clone().requires_grad_(), logits.clone().requires_grad_()
    got = head.add_block_bias(fused, prev, hidden)
    want = plain + head.block_bias(prev, hidden)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    weights = torch.randn(want.shape, dtype=torch.float64)
    grads = [
        torch.autograd.grad((out * weights).sum(), [x, head.markov_w2.weight])
        for out, x in ((got, fused), (want, plain))
    ]
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_fresh_head_starts_as_pure_dflash():
    head = MarkovHead(verifier_vocab_size=V, draft_vocab_size=VD, rank=R, hidden_size=H, kind="gated")
    prev, hidden = inputs()
    assert torch.count_nonzero(head.block_bias(prev, hidden.float())) == 0


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(kind="lstm"), "kind"),
        (dict(rank=-1), "rank"),
        (dict(rank=0), "rank"),
        (dict(gate_input="prev"), "gate_input"),
        (dict(gate_activation="relu"), "gate_activation"),
        (dict(draft_vocab_size=V + 1), "draft_vocab_size"),
    ],
)
def test_invalid_heads(kwargs, message):
    args = dict(verifier_vocab_size=V, draft_vocab_size=VD, rank=R, hidden_size=H) | kwargs
    with pytest.raises(ValueError, match=message):
        MarkovHead(**args)


@pytest.mark.parametrize(
    "stored, expected",
    [
        # the forms checkpoints and configs written before the config became one dataclass still read
        (
            {"class_path": "dspark_lightning.models.VanillaMarkov", "init_args": {"rank": 64}},
            ("vanilla", 64, "vanilla"),
        ),
        ({"class_path": "dspark_lightning.models.GatedMarkov"}, ("gated", 256, "gated")),
        ({"class_path": "dspark_lightning.models.SelectorMarkov", "init_args": {"rank": 8}}, ("gated", 8, "selector")),
        ({"class_path": "dspark_lightning.models.RnnMarkov", "init_args": {"rank": 4}}, ("rnn", 4, "rnn")),
        (
            {
                "class_path": "dspark_lightning.models.MarkovHeadConfig",
                "init_args": {"rank": 64, "head_type": "gated", "gate_input": "hidden", "gate_activation": "identity"},
            },
            ("gated", 64, "selector"),
        ),
        ({"kind": "gated", "rank": 3, "gate_input": "hidden"}, ("gated", 3, "gated")),
    ],
)
def test_head_config_reads_current_and_old_forms(stored, expected):
    config = MarkovHeadConfig.from_dict(stored)
    assert (config.kind, config.rank, config.label) == expected
    assert MarkovHeadConfig.from_dict(dataclasses.asdict(config)) == config  # asdict is the stored form


def test_head_config_validates_and_names_the_selector_form():
    assert MarkovHeadConfig.selector(8) == MarkovHeadConfig("gated", 8, "hidden", "identity")
    assert MarkovHeadConfig.selector(8).is_selector_form and not MarkovHeadConfig("gated", 8).is_selector_form
    for bad, message in (({"kind": "lstm"}, "kind"), ({"rank": -1}, "rank"), ({"gate_input": "prev"}, "gate_input")):
        with pytest.raises(ValueError, match=message):
            MarkovHeadConfig(**bad)
    with pytest.raises(ValueError, match="class_path"):
        MarkovHeadConfig.from_dict({"class_path": "os.system", "init_args": {}})
    with pytest.raises(dataclasses.FrozenInstanceError):
        MarkovHeadConfig().rank = 3


def test_rnn_has_no_transition_features():
    head = make_head(kind="rnn")
    prev, hidden = inputs()
    with pytest.raises(ValueError, match="path dependent"):
        head.transition_features(prev, hidden)


def test_confidence_head_is_a_logistic_regression():
    torch.manual_seed(0)
    head = ConfidenceHead(7).double()
    torch.nn.init.normal_(head.proj.weight)
    torch.nn.init.normal_(head.proj.bias)
    x = torch.randn(4, 3, 7, dtype=torch.float64)
    expected = x @ head.proj.weight[0] + head.proj.bias[0]
    torch.testing.assert_close(head(x), expected)
    with pytest.raises(ValueError, match="last dim 7"):
        head(torch.randn(2, 5, dtype=torch.float64))
