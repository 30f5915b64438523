"""A measured speculative-decoding loop: Hugging Face target + DSpark drafter (evaluation, not serving).

One step (batch 1):
  1. The target has processed every token but the newest one x (its KV cache and the drafter's context features
     cover them). The drafter drafts a block from [x, MASK, ...] in one forward: base logits + hidden states.
  2. The block is decoded in one of three modes: ``parallel`` (argmax / sample of the base logits, pure DFlash),
     ``markov`` (sequential full-vocabulary Markov decode, the head as trained) or ``selector`` (top-k walk over
     precomputed k x k pair scores). Each mode also returns the exact draft distribution q of every slot.
  3. Optionally the confidence head schedules how many slots to verify: threshold on the prefix survival
     a_n = prod_{j<=n} c_j, or a cost model maximising (1 + sum_{j<=n} a_j) / (t0 + t1 * n).
  4. One target forward over [x, d_1..d_n] verifies them. Greedy (temperature 0): accept the longest prefix equal
     to the target's argmax. Sampling: accept d_i with probability min(1, p(d_i) / q(d_i)), else resample from
     (p - q)_+ normalised and stop (standard speculative rejection sampling: the output distribution is exactly the
     target's). The target's own next token is always emitted, so every target forward yields >= 1 token.
     The LM head runs on the rows verification reads only (up to the first rejection): the decoder runs once over
     the block, the vocabulary-sized head row by row, and the prompt forward keeps its last row only.
  5. The KV cache is cropped to the accepted prefix; the target's hidden states of the anchor and the accepted
     tokens extend the drafter's context cache (``DraftContextCache``: fused features and every draft layer's
     context keys/values, projected once per token), so a draft step does not re-project the prefix.
At temperature 0 the output equals ``target.generate(do_sample=False)`` token for token (tests check it for every
mode, with EOS and ``max_new_tokens`` falling inside a block). ``drafter_cache=False`` re-projects the whole prefix
every step instead (the reference the cache is tested against: same tokens).

Design choices: batch size 1 (a clear error otherwise) - acceptance is per row and a batched loop needs ragged KV
caches, which serving engines do and this reference loop does not need. Phase times (``DecodeStats``) synchronise
CUDA at each phase boundary so that they measure the phase, not the kernel queue.
"""

from __future__ import annotations

import contextlib
import inspect
import time

import torch

from dspark_lightning.decoding.kernels import PackedLinears
from dspark_lightning.decoding.modes import MODES, draft_block
from dspark_lightning.decoding.stats import DecodeStats
from dspark_lightning.decoding.verify import verify_block
from dspark_lightning.models.drafter import DSparkDrafter


def _hf_model(target):
    return getattr(target, "model", target) if not hasattr(target, "generate") else target


def _layer_ids(target, drafter: DSparkDrafter) -> list[int]:
    ids = getattr(target, "target_layer_ids", None) or drafter.config.target_layer_ids
    if ids is None:
        raise ValueError("the drafter's config has no target_layer_ids and the target does not provide them")
    return list(ids)


def prefix_survival(drafter: DSparkDrafter, hidden: torch.Tensor, prev_tokens: torch.Tensor) -> torch.Tensor | None:
    """a_n = prod_{j<=n} c_j from the (calibrated) confidence head; hidden [1, B', H], prev [1, B'] -> [B']."""
    logits = drafter.confidence_logits(hidden, prev_tokens)
    if logits is None:
        return None
    temperature = drafter.config.trained_slots(drafter.confidence_temperature, dim=0)
    return torch.cumprod(torch.sigmoid(logits[0].float() / temperature), dim=0)


def scheduled_length(
    survival: torch.Tensor | None,
    block: int,
    threshold: float | None,
    cost_model: tuple[float, float] | None,
) -> int:
    """How many drafted slots to verify: always in [1, block]."""
    if survival is None or (threshold is None and cost_model is None):
        return block
    if cost_model is not None:
        t0, t1 = cost_model
        n = torch.arange(1, block + 1, dtype=torch.float32)
        gain = (1.0 + torch.cumsum(survival[:block], 0)) / (t0 + t1 * n)
        return int(gain.argmax()) + 1
    above = (survival[:block] >= threshold).nonzero()
    return max(1, int(above.max()) + 1) if len(above) else 1


@torch.no_grad()
def speculative_generate(
    target,
    drafter: DSparkDrafter,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    *,
    mode: str,
    k: int = 16,
    temperature: float = 0.0,
    confidence_threshold: float | None = None,
    generator: torch.Generator | None = None,
    cost_model: tuple[float, float] | None = None,
    eos_token_id: int | list[int] | None = None,
    drafter_cache: bool = True,
    record_blocks: bool = False,
    packed_verify: bool = False,
) -> tuple[torch.Tensor, DecodeStats]:
    """Speculative generation; returns (prompt + new tokens [1, T], stats). See the module docstring.

    ``target`` is a ``FrozenTarget`` or a Hugging Face causal LM (then ``drafter.config.target_layer_ids`` says
    which layers feed the drafter). ``eos_token_id`` defaults to the target's generation config.
    ``drafter_cache=False`` recomputes the drafter's context projections over the whole prefix at every step.
    ``record_blocks`` keeps each step's anchor position and drafted tokens in the stats (``decoding.identity``
    replays them teacher-forced); off by default because listing the drafted tokens costs a copy per step.
    ``packed_verify`` runs the verify forwards' decoder linears on oneDNN-packed weights (``decoding.kernels``:
    float32 CPU targets; faster at 2-17 rows on AVX2, one more copy of the decoder weights in memory).
    """
    from transformers import DynamicCache

    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; expected one of {MODES}")
    if input_ids.ndim != 2 or input_ids.shape[0] != 1:
        raise ValueError(
            f"speculative_generate decodes one sequence at a time: input_ids must be [1, T], got {tuple(input_ids.shape)}"
        )
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    model = _hf_model(target)
    layer_ids = _layer_ids(target, drafter)
    device = input_ids.device
    if eos_token_id is None:
        eos_token_id = model.generation_config.eos_token_id
    eos = set([eos_token_id] if isinstance(eos_token_id, int) else (eos_token_id or []))
    stats = DecodeStats(mode, k, temperature, confidence_threshold)
    cache = DynamicCache()
    cache_kwarg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def clock() -> float:
        sync()
        return time.perf_counter()

    body = getattr(model, getattr(model, "base_model_prefix", ""), None)
    head = model.get_output_embeddings()
    body_forward = body.forward if body is not None else model.forward
    base_cache_kwarg = "cache" if "cache" in inspect.signature(body_forward).parameters else "past_key_values"
    # The verify forward only (2..B+1 rows): the prompt forward keeps the default kernels, tuned for long inputs.
    verify_kernels = (
        PackedLinears(body if body is not None else model, drafter.block_size + 1)
        if packed_verify
        else contextlib.nullcontext()
    )
    own_head = False  # set by the prefill: True when logits == head(final hidden state), checked on the real output

    def prefill(tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The prompt forward: the last row's logits only (as ``generate`` computes them) and every row's features."""
        nonlocal own_head
        positions = torch.arange(tokens.shape[1], device=device)[None]
        keep = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}
        final = []
        hook = body.register_forward_hook(lambda _m, _a, out: final.append(out[0])) if body is not None else None
        try:
            out = model(
                input_ids=tokens, position_ids=positions, use_cache=True, output_hidden_states=True,
                **keep, **{cache_kwarg: cache},
            )  # fmt: skip
        finally:
            if hook is not None:
                hook.remove()
        logits = out.logits[0, -1].float()
        # A model that post-processes its logits (soft-capping, a logit scale) keeps the full-logits verify path.
        own_head = bool(final) and head is not None and torch.allclose(head(final[0][:, -1:])[0, -1].float(), logits)
        return logits, torch.cat([out.hidden_states[i + 1] for i in layer_ids], dim=-1)

    def target_forward(tokens: torch.Tensor, start: int):
        """Verify forward over [x, d_1..d_n] -> (logits rows, features [1, n+1, F]).

        The LM head is applied row by row on demand (``_RowLogits``): verification reads rows in order and stops
        at the first rejection, and on a CPU one vocabulary-sized head row costs as much as several decoder layers.
        """
        positions = torch.arange(start, start + tokens.shape[1], device=device)[None]
        kwargs = dict(input_ids=tokens, position_ids=positions, use_cache=True, output_hidden_states=True)
        with verify_kernels:
            if own_head:
                out = body(**kwargs, **{base_cache_kwarg: cache})
            else:
                out = model(**kwargs, **{cache_kwarg: cache})
        if own_head:
            logits = _RowLogits(head, out.last_hidden_state[0])  # head rows on the default kernels, on demand
        else:
            logits = out.logits[0].float()
        return logits, torch.cat([out.hidden_states[i + 1] for i in layer_ids], dim=-1)

    def choose(logits_row: torch.Tensor) -> int:
        if temperature == 0:
            return int(logits_row.argmax())
        return int(torch.multinomial(torch.softmax(logits_row / temperature, -1), 1, generator=generator))

    start = clock()
    logits, context = prefill(input_ids)
    context_cache = None
    if drafter_cache:
        context_cache = drafter.new_context_cache(device=device, capacity=input_ids.shape[1] + 2 * drafter.block_size)
        context_cache.extend(context)
    generated: list[int] = [choose(logits)]
    processed = input_ids.shape[1]  # tokens in the KV cache and in the drafter's context
    stats.prefill_seconds = clock() - start

    while len(generated) < max_new_tokens and generated[-1] not in eos:
        anchor = torch.tensor([generated[-1]], device=device)
        t0 = clock()
        if context_cache is not None:
            base, hidden = drafter.draft_cached(context_cache, anchor, torch.tensor([processed], device=device))
        else:
            positions = torch.arange(processed, device=device)[None]
            base, hidden = drafter.draft(context, positions, anchor, torch.tensor([processed], device=device))
        base, hidden = drafter.config.trained_slots(base), drafter.config.trained_slots(hidden)
        t1 = clock()
        stats.draft_backbone_seconds += t1 - t0
        drafted, q = draft_block(drafter, base, hidden, anchor, mode, k, temperature, generator)
        block = drafted.shape[0]
        if confidence_threshold is not None or cost_model is not None:
            prev = torch.cat((anchor, drafted[:-1]))[None]
            n = scheduled_length(prefix_survival(drafter, hidden, prev), block, confidence_threshold, cost_model)
            drafted, q = drafted[:n], (q[:n] if q is not None else None)
        t2 = clock()
        stats.draft_head_seconds += t2 - t1

        verify_tokens = torch.cat((anchor, drafted))[None]
        logits, features = target_forward(verify_tokens, processed)
        accepted, next_token = verify_block(drafted, q, logits, drafter, temperature, generator)
        t3 = clock()
        stats.verify_seconds += t3 - t2

        new = drafted[:accepted].tolist() + [next_token]
        stats.verified_per_step.append(drafted.shape[0])
        stats.accepted_per_step.append(accepted)
        stats.emitted_per_step.append(len(new))
        if record_blocks:
            stats.anchor_positions.append(processed)  # the anchor is token ``processed`` of prompt + output
            stats.drafted_per_step.append(drafted.tolist())
        keep = processed + 1 + accepted  # anchor + accepted drafts now belong to the verified prefix
        surplus = cache.get_seq_length() - keep
        if surplus > 0:
            cache.crop(-surplus)  # negative = "remove this many", valid in transformers 4.x and 5.x
        if context_cache is not None:
            context_cache.extend(features[:, : 1 + accepted])
        else:
            context = torch.cat((context, features[:, : 1 + accepted]), dim=1)
        processed = keep
        generated.extend(new)
        stats.bookkeeping_seconds += clock() - t3

    generated = _truncate(generated, max_new_tokens, eos)
    stats.new_tokens = len(generated)
    output = torch.cat((input_ids, torch.tensor([generated], device=device, dtype=input_ids.dtype)), dim=1)
    return output, stats


def _truncate(tokens: list[int], max_new_tokens: int, eos: set[int]) -> list[int]:
    """Cut at the first EOS (kept) and at ``max_new_tokens``, exactly as ``generate`` stops."""
    for i, token in enumerate(tokens):
        if token in eos:
            tokens = tokens[: i + 1]
            break
    return tokens[:max_new_tokens]


class _RowLogits:
    """The target logits of one verify forward, row i = ``head(hidden[i])`` computed when read."""

    def __init__(self, head, hidden: torch.Tensor) -> None:
        self.head, self.hidden = head, hidden

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.head(self.hidden[i : i + 1])[0].float()
