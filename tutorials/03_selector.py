# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 03 · The Selector: a Markov head, run in parallel
#
# With a Markov head, drafting a block is sequential: slot `t` needs the token chosen at slot `t-1`, and each step
# adds a bias over the **whole draft vocabulary** (`r x Vd` multiply-adds per slot; `Vd` = 152k for Qwen3). The
# **Selector** (DFlash-2) removes both costs:
#
# 1. keep only the top-`k` candidates `C_t` of each slot's base logits `U_t`;
# 2. score every adjacent pair at once: `S_t(a, b) = U_t(b) + bias_t(a)(b)` for `a ∈ C_{t-1}`, `b ∈ C_t` - a
#    `k x k` matrix per slot, all slots in one batched matmul (`pair_scores`);
# 3. walk: `x_t = argmax_{b ∈ C_t} S_t(x_{t-1}, b)` - `B` cheap gathers (`selector_decode`).
#
# A gated Markov head executed this way *is* the Selector. This notebook shows, with numbers:
#
# 1. the equivalences: with `k = Vd` the walk **is** the sequential decode; a gated head whose gate is 1 **is** the
#    vanilla head; the pair scores are the head's own logits restricted to the candidates;
# 2. on a trained head: how coverage and agreement grow with `k`, and what they cost in acceptance;
# 3. timing: walk vs sequential decode;
# 4. converting trained heads without retraining: a DSpark gated head decoding as a Selector (measured with the
#    target), and a DFlash-2 form head exported to / imported from the `CandidateSelector` weight layout.

# %%
import copy
import os
import tempfile
import time
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import torch

from dspark_lightning.cli import cli_main
from dspark_lightning.decoding import speculative_generate
from dspark_lightning.measuring.tables import measured_decoding
from dspark_lightning.measuring.validation_blocks import collect_blocks
from dspark_lightning.models import MarkovHead
from dspark_lightning.selector import equivalence_report, pair_scores, selector_decode, sequential_decode
from dspark_lightning.selector.convert import candidate_selector_scores, from_candidate_selector, to_candidate_selector
from dspark_lightning.studies.quiet_output import quiet_logs
from dspark_lightning.studies.runs import demo_fit_args

torch.set_num_threads(1)
quiet_logs()  # Lightning info lines and known harmless warnings off
# %matplotlib inline
WORK = Path(os.environ.get("DSPARK_TUTORIAL_DIR") or tempfile.mkdtemp(prefix="dspark-tutorial-"))
# every fit's training steps and the validation prompts each decoding demo runs; the notebook tests set a few of each
# (they check that the tutorial runs and its decoders agree, not what it learns)
STEPS = int(os.environ.get("DSPARK_TUTORIAL_STEPS", "200"))
PROMPTS = int(os.environ.get("DSPARK_TUTORIAL_PROMPTS", "8"))

# %% [markdown]
# ## 1. The equivalences, on a random head
#
# No training needed: a gated head with random weights (its `W2` starts at zero, which would make every bias 0, so we
# randomise it), random base logits for 64 blocks of 8 slots over a 300-token vocabulary.

# %%
torch.manual_seed(0)
V, r, H, N, B = 300, 16, 32, 64, 8
gated = MarkovHead(verifier_vocab_size=V, draft_vocab_size=V, rank=r, hidden_size=H, kind="gated")
torch.nn.init.normal_(gated.markov_w2.weight, std=0.5)
base = 2.0 * torch.randn(N, B, V)  # U_t: the backbone's base logits
hidden = torch.randn(N, B, H)  # h_t: the draft hidden states (the gate reads them)
first_prev = torch.randint(V, (N,))  # the anchor: previous token of slot 0

with torch.no_grad():
    sequential = sequential_decode(base, gated, first_prev, hidden)
    for k in (1, 4, 16, 64, V):
        walk = selector_decode(base, gated, first_prev, hidden, k)
        print(f"k = {k:3d}: walk == sequential on {(walk == sequential).float().mean():6.1%} of slots")
    assert torch.equal(selector_decode(base, gated, first_prev, hidden, V), sequential)

# %% [markdown]
# With `k = Vd` every token is a candidate, and the walk returns exactly the sequential decode (bit for bit: the
# `assert` above). With small `k` it can only pick tokens inside the top-`k` of the *base* logits.
#
# **Pair scores are the head's logits.** `scores[n, t, i, j]` scores candidate `j` of slot `t` after candidate `i` of
# slot `t-1`. Compute the same numbers the slow way - the head's full-vocabulary logits `U_t + bias(a, h_t)` for
# every predecessor candidate `a`, read at the candidates:

# %%
k = 8
with torch.no_grad():
    candidates, scores = pair_scores(base, gated, first_prev, hidden, k)
    worst = 0.0
    for t in range(1, B):
        prev = candidates[:, t - 1]  # [N, k] predecessor candidates
        h = hidden[:, t, None, :].expand(N, k, H)
        full = base[:, t, None, :] + gated.step_bias(prev.reshape(-1), h.reshape(-1, H))[0].view(N, k, V)
        slow = full.gather(-1, candidates[:, t, None, :].expand(N, k, k))  # [N, k(pred), k(cand)]
        worst = max(worst, (slow - scores[:, t]).abs().max().item())
print(f"pair_scores vs the head's own logits at the candidates: max |difference| = {worst:.1e}")

# %% [markdown]
# **A gated head whose gate is fixed at 1 is the vanilla head.** Zero the gate's weights and set its bias to 40:
# `sigmoid(40)` is exactly 1.0 in floating point, so `W1[a] ⊙ g = W1[a]`.

# %%
fixed = copy.deepcopy(gated)
vanilla = MarkovHead(verifier_vocab_size=V, draft_vocab_size=V, rank=r, hidden_size=H, kind="vanilla")
with torch.no_grad():
    fixed.gate_proj.weight.zero_()
    fixed.gate_proj.bias.fill_(40.0)
    vanilla.markov_w1.weight.copy_(gated.markov_w1.weight)
    vanilla.markov_w2.weight.copy_(gated.markov_w2.weight)
    same_scores = torch.equal(
        pair_scores(base, fixed, first_prev, hidden, 16)[1], pair_scores(base, vanilla, first_prev, None, 16)[1]
    )
    same_tokens = torch.equal(
        sequential_decode(base, fixed, first_prev, hidden), sequential_decode(base, vanilla, first_prev, None)
    )
print(f"gate = 1: pair scores identical: {same_scores}, sequential tokens identical: {same_tokens}")  # fmt: skip

# %% [markdown]
# ## 2. Coverage and agreement on a trained head
#
# Now a real drafter: a gated head (the DSpark checkpoint form, `configs/heads/gated.yaml`) trained for 200 steps on
# the demo. `collect_blocks` runs it over validation blocks (the same deterministic blocks as the validation
# metrics) and keeps what the Selector needs: base logits, hidden states, the anchors and the target's distribution.

# %%
cli = cli_main(["fit", *demo_fit_args(WORK, head="gated", steps=STEPS, eval_prompts=PROMPTS)])
module = cli.model
head = module.drafter.markov_head
blocks = collect_blocks(module, cli.datamodule.val_dataloader(), max_blocks=256)
print(head)
print(
    f"{blocks.num_blocks} validation blocks of {blocks.valid.shape[1]} slots, vocabulary {blocks.base_logits.shape[-1]}"
)

# %% [markdown]
# `equivalence_report` decodes the blocks sequentially once and with the walk for each `k`, and measures
#
# - **coverage@k**: the sequential decode's token is among the top-`k` base logits (the walk *could* pick it);
# - **agreement@k**: the walk picks the same token as the sequential decode;
# - **tau** of both decodes against the target (teacher-forced), and their wall times.

# %%
ks = (1, 2, 4, 8, 16, 32, 64, 128)
report = equivalence_report(
    blocks.base_logits, head, blocks.first_prev, blocks.hidden, blocks.teacher_logprobs, ks, blocks.valid
)
table = pd.DataFrame(
    {
        "coverage": report.coverage,
        "agreement": report.agreement,
        "agreed prefix (slots)": report.agreed_prefix,
        "tau walk": report.tau_walk,
        "walk ms": {q: 1000 * s for q, s in report.time_walk_s.items()},
    }
)
print(f"sequential decode: tau {report.tau_sequential:.3f}, {1000 * report.time_sequential_s:.1f} ms")
table.round(3)

# %%
fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
axes[0].plot(ks, table["coverage"], marker="o", label="coverage@k")
axes[0].plot(ks, table["agreement"], marker="x", ls="--", label="agreement@k")
axes[0].set(xscale="log", xlabel="k (candidates per slot)", ylabel="fraction of slots", title="walk vs sequential")
axes[1].plot(ks, table["tau walk"], marker="o", label="Selector walk")
axes[1].axhline(report.tau_sequential, color="gray", ls=":", label="sequential decode")
axes[1].set(xscale="log", xlabel="k", ylabel="tau (teacher-forced)", title="acceptance of the drafted tokens")
for ax in axes:
    ax.set_xscale("log", base=2)
    ax.grid(alpha=0.3)
    ax.legend()
fig.tight_layout()

# %% [markdown]
# Coverage and agreement grow with `k` and reach 1 at `k = Vd` (section 1). They differ because once the walk
# departs from the sequential path, later slots condition on a different previous token. What matters for speed is
# the right panel: how much acceptance the walk gives up for its parallelism at the `k` you would deploy (DFlash-2
# uses small `k` such as 16). On this tiny demo the Markov bias is strong relative to the spread of the base logits,
# so the sequential choice is often outside a small top-`k`; section 4 trains the DFlash-2 form with the candidate
# loss and compares the two as Selectors.
#
# ## 3. Timing: walk vs sequential decode
#
# On the demo (`Vd` = 2048) both take about a millisecond; the difference shows with a real vocabulary. Here is one
# batch of 16 blocks of 16 slots for `Vd` = 32768 with random weights (the speed does not depend on the values).
# `python -m benchmarks.decoding.selector_walk` measures it properly (`Vd` up to 152k, several batch sizes).


# %%
def best_of(fn, repeats=3):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


Vd, Hb, Nb, Bb = 32768, 256, 16, 16
torch.manual_seed(0)
big = MarkovHead(verifier_vocab_size=Vd, draft_vocab_size=Vd, rank=64, hidden_size=Hb, kind="gated")
torch.nn.init.normal_(big.markov_w2.weight, std=0.1)
big_base, big_hidden, big_prev = torch.randn(Nb, Bb, Vd), torch.randn(Nb, Bb, Hb), torch.randint(Vd, (Nb,))
with torch.no_grad():
    t_seq = best_of(lambda: sequential_decode(big_base, big, big_prev, big_hidden))
    t_walk = best_of(lambda: selector_decode(big_base, big, big_prev, big_hidden, 16))
print(
    f"Vd = {Vd}: sequential {1000 * t_seq:.1f} ms, Selector walk (k = 16) {1000 * t_walk:.1f} ms: {t_seq / t_walk:.1f}x"
)

# %% [markdown]
# ## 4. Converting trained heads - no retraining
#
# **A DSpark gated head decodes as a Selector as it is.** The walk only *reads* the head's weights, so the head
# trained above drafts in `selector` mode directly. Measured with the real target (greedy speculative decoding on
# 8 validation prompts):

# %%
prompts = cli.datamodule.eval_prompts()
decoded = measured_decoding(module, prompts, ["parallel", "markov", "selector"], max_new_tokens=64, k=16)
pd.DataFrame(
    {
        mode: {"tau": row.tau, "mean_verified": row.mean_verified, "tokens_per_second": row.tokens_per_second}
        for mode, row in decoded.items()
    }
).T.round(3)

# %% [markdown]
# Speculative decoding is lossless whatever the draft: at temperature 0 the output is the target's own greedy
# continuation, token for token, in every mode; only the number of target forwards changes.

# %%
prompt = torch.tensor([prompts[0]])
outputs = {
    mode: speculative_generate(module.target, module.drafter, prompt, 48, mode=mode, k=16)
    for mode in ("markov", "selector")
}
print({mode: f"{stats.target_forwards} target forwards" for mode, (_, stats) in outputs.items()})
assert torch.equal(outputs["markov"][0], outputs["selector"][0])

# %% [markdown]
# The gate-fixed-at-1 identity holds for trained weights too: the trained gated head with its gate forced to 1 and a
# vanilla head made of its `W1`, `W2` draft identical tokens on every validation block.

# %%
forced = copy.deepcopy(head)
as_vanilla = MarkovHead(
    verifier_vocab_size=head.verifier_vocab_size,
    draft_vocab_size=head.draft_vocab_size,
    rank=head.config.rank,
    hidden_size=head.hidden_size,
    kind="vanilla",
)
with torch.no_grad():
    forced.gate_proj.weight.zero_()
    forced.gate_proj.bias.fill_(40.0)
    as_vanilla.load_state_dict({k: v for k, v in head.state_dict().items() if k.startswith("markov_w")})
    a = selector_decode(blocks.base_logits, forced, blocks.first_prev, blocks.hidden, 16)
    b = selector_decode(blocks.base_logits, as_vanilla, blocks.first_prev, None, 16)
print("gate = 1 on the trained head == vanilla head from its W1, W2:", torch.equal(a, b))

# %% [markdown]
# **The DFlash-2 `CandidateSelector` layout.** DFlash-2 scores `S_t(a, b) = U_t(b) + <A(a) ⊙ H(h_t), B(b)>` with a
# predecessor codebook `A`, a successor codebook `B` and a bias-free projection `H`. That is exactly a gated head with
# `gate_input: hidden` and `gate_activation: identity` (`configs/heads/selector.yaml`; that config also turns on the
# DFlash-2 *candidate loss*, a cross-entropy over the top-`k` candidates of each slot, whose recall is logged as
# `train/candidate_recall@16`). Train that form briefly, export its weights to the `CandidateSelector` keys, score
# directly from those tensors, and import them back:

# %%
cli2 = cli_main(["fit", *demo_fit_args(WORK, head="selector", steps=STEPS)])
print("candidate recall@16:", float(cli2.trainer.callback_metrics["train/candidate_recall@16"]))
selector_head = cli2.model.drafter.markov_head
state = to_candidate_selector(selector_head)
for key, tensor in state.items():
    print(f"{key:45s} {tuple(tensor.shape)}")

blocks2 = collect_blocks(cli2.model, cli2.datamodule.val_dataloader(), max_blocks=256)
with torch.no_grad():
    ours = pair_scores(blocks2.base_logits, selector_head, blocks2.first_prev, blocks2.hidden, 16)
    theirs = candidate_selector_scores(state, blocks2.base_logits, blocks2.first_prev, blocks2.hidden, 16)
    back = from_candidate_selector(state)
    same = torch.equal(
        selector_decode(blocks2.base_logits, back, blocks2.first_prev, blocks2.hidden, 16),
        selector_decode(blocks2.base_logits, selector_head, blocks2.first_prev, blocks2.hidden, 16),
    )
print(
    f"same candidates: {torch.equal(ours[0], theirs[0])}, max |score difference|: {(ours[1] - theirs[1]).abs().max():.1e}"
)
print(f"re-imported head drafts identical tokens: {same}")

# %% [markdown]
# `dspark-lightning export --ckpt_path <run>/checkpoints/last.ckpt --output <dir> --candidate_selector true` writes a
# checkpoint in this layout for serving. Finally, the two gate forms side by side *as Selectors* at `k = 16`, on
# their own validation blocks (same blocks, different drafters):

# %%
report2 = equivalence_report(
    blocks2.base_logits,
    selector_head,
    blocks2.first_prev,
    blocks2.hidden,
    blocks2.teacher_logprobs,
    (16,),
    blocks2.valid,
)
pd.DataFrame(
    {
        "DSpark gated (hidden+prev, sigmoid)": [report.coverage[16], report.agreement[16], report.tau_walk[16], report.tau_sequential],
        "DFlash-2 form (hidden, identity)": [report2.coverage[16], report2.agreement[16], report2.tau_walk[16], report2.tau_sequential],
    },
    index=["coverage@16", "agreement@16", "tau walk@16", "tau sequential"],
).round(3)  # fmt: skip

# %% [markdown]
# Both heads decode equally well sequentially, but as a Selector the identity-gated form is much worse here, although
# it trained with the DFlash-2 candidate loss (weight 0.5 in `configs/heads/selector.yaml`): at this budget the loss
# does not pull the token the head prefers into the top-`k` base logits, and the unbounded gate lets the bias override
# them. The SmolLM2 report (`experiments/smollm2_heads/1200steps/report.md`) shows the same at 1,200 steps: coverage@16 0.463 for this
# form against 0.842 for the gated head. `val/selector/coverage@k` / `agreement@k` (logged by the
# `SelectorEquivalenceCallback` in the quickstart config) let you watch it during training.
