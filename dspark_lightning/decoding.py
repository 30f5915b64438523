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
  5. The KV cache is cropped to the accepted prefix; the target's hidden states of the accepted tokens are appended
     to the drafter's context.
At temperature 0 the output equals ``target.generate(do_sample=False)`` token for token (tests check it for every
mode, with EOS and ``max_new_tokens`` falling inside a block).

Design choices: batch size 1 (a clear error otherwise) - acceptance is per row and a batched loop needs ragged KV
caches, which serving engines do and this reference loop does not need; the drafter recomputes its context
projections from the stored target features each step (simple and exact; a serving engine caches them).
"""

from __future__ import annotations

import inspect
import time
from dataclasses import dataclass, field

import torch

from dspark_lightning.models.drafter import DSparkDrafter
from dspark_lightning.selector import selector_walk, sequential_walk

MODES = ("parallel", "markov", "selector")


@dataclass
class DecodeStats:
    mode: str
    k: int
    temperature: float
    confidence_threshold: float | None
    accepted_per_step: list[int] = field(default_factory=list)  # drafted tokens accepted per verification
    verified_per_step: list[int] = field(default_factory=list)  # drafted tokens sent to verification
    emitted_per_step: list[int] = field(default_factory=list)  # tokens appended per target forward
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    prefill_seconds: float = 0.0
    new_tokens: int = 0

    @property
    def target_forwards(self) -> int:
        return len(self.emitted_per_step)

    @property
    def tau(self) -> float:
        """Tokens emitted per verifying target forward (the measured acceptance length)."""
        return sum(self.emitted_per_step) / max(1, self.target_forwards)

    @property
    def accepted_rate_per_slot(self) -> list[float]:
        """P(slot k accepted | it was verified) over the run."""
        longest = max(self.verified_per_step, default=0)
        rates = []
        for slot in range(longest):
            tried = sum(1 for v, a in zip(self.verified_per_step, self.accepted_per_step) if v > slot and a >= slot)
            ok = sum(1 for v, a in zip(self.verified_per_step, self.accepted_per_step) if v > slot and a > slot)
            rates.append(ok / tried if tried else float("nan"))
        return rates

    def as_dict(self) -> dict:
        total = self.draft_seconds + self.verify_seconds + self.prefill_seconds
        return dict(
            mode=self.mode,
            k=self.k,
            temperature=self.temperature,
            confidence_threshold=self.confidence_threshold,
            new_tokens=self.new_tokens,
            target_forwards=self.target_forwards,
            tau=self.tau,
            mean_verified=sum(self.verified_per_step) / max(1, len(self.verified_per_step)),
            draft_seconds=self.draft_seconds,
            verify_seconds=self.verify_seconds,
            tokens_per_second=self.new_tokens / total if total > 0 else float("nan"),
            accepted_rate_per_slot=self.accepted_rate_per_slot,
        )


def _hf_model(target):
    return getattr(target, "model", target) if not hasattr(target, "generate") else target


def _layer_ids(target, drafter: DSparkDrafter) -> list[int]:
    ids = getattr(target, "target_layer_ids", None) or drafter.config.target_layer_ids
    if ids is None:
        raise ValueError("the drafter's config has no target_layer_ids and the target does not provide them")
    return list(ids)


def draft_block(
    drafter: DSparkDrafter,
    base_logits: torch.Tensor,
    hidden: torch.Tensor,
    anchor: torch.Tensor,
    mode: str,
    k: int,
    temperature: float,
    generator: torch.Generator | None,
):
    """Decode one drafted block [1, B', Vd] -> (target ids [B'], q over the draft vocab [B', Vd] or None)."""
    head = drafter.markov_head if mode != "parallel" else None
    d2t = drafter.d2t
    if mode == "selector":
        if drafter.markov_head is not None and drafter.markov_head.is_path_dependent:
            raise ValueError("mode='selector' needs a vanilla or gated Markov head; the rnn head is path dependent")
        walk = selector_walk(
            base_logits, head, anchor, hidden, k, temperature=temperature, generator=generator, d2t=d2t
        )
        tokens, q = walk.tokens, (walk.full_probs() if temperature > 0 else None)
    else:
        walk = sequential_walk(base_logits, head, anchor, hidden, temperature=temperature, generator=generator, d2t=d2t)
        tokens, q = walk.tokens, (walk.probs if temperature > 0 else None)
    target_ids = tokens[0] if d2t is None else d2t[tokens[0]]
    return target_ids, (q[0] if q is not None else None)


def prefix_survival(drafter: DSparkDrafter, hidden: torch.Tensor, prev_tokens: torch.Tensor) -> torch.Tensor | None:
    """a_n = prod_{j<=n} c_j from the (calibrated) confidence head; hidden [1, B', H], prev [1, B'] -> [B']."""
    logits = drafter.confidence_logits(hidden, prev_tokens)
    if logits is None:
        return None
    temperature = drafter.confidence_temperature[-logits.shape[-1] :]
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
def measure_verify_cost(
    target, prompt_length: int = 64, max_block: int = 16, repeats: int = 5, device: str | torch.device = "cpu"
) -> tuple[float, float]:
    """Fit T(n) = t0 + t1 * n, the wall time of one verifying target forward over n+1 new tokens on a cached prefix.

    Times the real target (median of ``repeats`` per n, after a warm-up) for n = 1..max_block and fits t0, t1 by
    least squares; the result is the ``cost_model`` argument of ``speculative_generate``.
    """
    from transformers import DynamicCache

    model = _hf_model(target)
    vocab = model.get_input_embeddings().weight.shape[0]
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, vocab, (1, prompt_length), generator=generator).to(device)
    cache_kwarg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    lengths, seconds = [], []
    for n in [1, *range(1, max_block + 1)]:  # the first n = 1 is a warm-up
        block = torch.randint(0, vocab, (1, n + 1), generator=generator).to(device)
        times = []
        for _ in range(repeats):
            cache = DynamicCache()
            model(input_ids=prompt, use_cache=True, **{cache_kwarg: cache})
            if torch.cuda.is_available() and torch.device(device).type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            model(input_ids=block, use_cache=True, **{cache_kwarg: cache})
            if torch.cuda.is_available() and torch.device(device).type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        lengths.append(n)
        seconds.append(sorted(times)[len(times) // 2])
    x = torch.tensor(lengths[1:], dtype=torch.float64)
    y = torch.tensor(seconds[1:], dtype=torch.float64)
    design = torch.stack((torch.ones_like(x), x), dim=1)
    t0, t1 = torch.linalg.lstsq(design, y[:, None]).solution[:, 0].tolist()
    return max(t0, 1e-9), max(t1, 0.0)


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
) -> tuple[torch.Tensor, DecodeStats]:
    """Speculative generation; returns (prompt + new tokens [1, T], stats). See the module docstring.

    ``target`` is a ``FrozenTarget`` or a Hugging Face causal LM (then ``drafter.config.target_layer_ids`` says
    which layers feed the drafter). ``eos_token_id`` defaults to the target's generation config.
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
    first = drafter.config.first_trained_slot
    cache = DynamicCache()
    cache_kwarg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    def target_forward(tokens: torch.Tensor, start: int):
        positions = torch.arange(start, start + tokens.shape[1], device=device)[None]
        out = model(
            input_ids=tokens, position_ids=positions, use_cache=True, output_hidden_states=True, **{cache_kwarg: cache}
        )
        features = torch.cat([out.hidden_states[i + 1] for i in layer_ids], dim=-1)
        return out.logits[0].float(), features

    def choose(logits_row: torch.Tensor) -> int:
        if temperature == 0:
            return int(logits_row.argmax())
        return int(torch.multinomial(torch.softmax(logits_row / temperature, -1), 1, generator=generator))

    start = time.perf_counter()
    logits, context = target_forward(input_ids, 0)
    stats.prefill_seconds = time.perf_counter() - start
    generated: list[int] = [choose(logits[-1])]
    processed = input_ids.shape[1]  # tokens in the KV cache and in ``context``

    while len(generated) < max_new_tokens and generated[-1] not in eos:
        anchor = torch.tensor([generated[-1]], device=device)
        t0 = time.perf_counter()
        base, hidden = drafter.draft(
            context, torch.arange(processed, device=device)[None], anchor, torch.tensor([processed], device=device)
        )
        base, hidden = base[:, first:], hidden[:, first:]
        drafted, q = draft_block(drafter, base, hidden, anchor, mode, k, temperature, generator)
        block = drafted.shape[0]
        if confidence_threshold is not None or cost_model is not None:
            prev = torch.cat((anchor, drafted[:-1]))[None]
            n = scheduled_length(prefix_survival(drafter, hidden, prev), block, confidence_threshold, cost_model)
            drafted, q = drafted[:n], (q[:n] if q is not None else None)
        stats.draft_seconds += time.perf_counter() - t0

        t0 = time.perf_counter()
        verify_tokens = torch.cat((anchor, drafted))[None]
        logits, features = target_forward(verify_tokens, processed)
        accepted, next_token = _verify(drafted, q, logits, drafter, temperature, generator)
        stats.verify_seconds += time.perf_counter() - t0

        new = drafted[:accepted].tolist() + [next_token]
        stats.verified_per_step.append(drafted.shape[0])
        stats.accepted_per_step.append(accepted)
        stats.emitted_per_step.append(len(new))
        keep = processed + 1 + accepted  # anchor + accepted drafts now belong to the verified prefix
        surplus = cache.get_seq_length() - keep
        if surplus > 0:
            cache.crop(-surplus)  # negative = "remove this many", valid in transformers 4.x and 5.x
        context = torch.cat((context, features[:, : 1 + accepted]), dim=1)
        processed = keep
        generated.extend(new)

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


def _verify(drafted, q, logits, drafter, temperature, generator) -> tuple[int, int]:
    """Accept a prefix of ``drafted`` given the target logits [n+1, V] of [x, d_1..d_n]; return (#accepted, next)."""
    n = drafted.shape[0]
    if temperature == 0:
        target_tokens = logits.argmax(-1)
        matches = (target_tokens[:n] == drafted).int()
        accepted = int(torch.cumprod(matches, 0).sum())
        return accepted, int(target_tokens[accepted])
    p = torch.softmax(logits / temperature, dim=-1)
    q_target = torch.zeros_like(p[:n])
    d2t = drafter.d2t
    if d2t is None:
        q_target[:, : q.shape[-1]] = q
    else:
        q_target[:, d2t] = q
    for i in range(n):
        token = int(drafted[i])
        ratio = p[i, token] / q_target[i, token].clamp_min(1e-30)
        if torch.rand((), generator=generator) < ratio:
            continue
        residual = (p[i] - q_target[i]).clamp_min(0)
        if residual.sum() <= 0:  # p == q: any rejection is measure-zero; fall back to p
            residual = p[i]
        return i, int(torch.multinomial(residual / residual.sum(), 1, generator=generator))
    return n, int(torch.multinomial(p[n], 1, generator=generator))
