"""Decoding walks over a drafted block: the Selector walk over pair scores and the sequential full-vocabulary
reference. Both return their draft distribution q (one-hot when greedy) for lossless rejection sampling."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from dspark_lightning.dtypes import at_least_float32
from dspark_lightning.models.markov import MarkovHead
from dspark_lightning.selector.pairs import _check_inputs, _to_target_ids, pair_scores


def _check_temperature(temperature: float) -> None:
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature}")


def _choose(row_logits: torch.Tensor, temperature: float, generator: torch.Generator | None):
    """Greedy (T = 0) or sampled choice along the last dim -> (index [N], sampling distribution [N, m] or None).

    Greedy choices return ``None`` for the distribution: callers build the one-hot q once, after the loop.
    """
    if temperature == 0:
        return row_logits.argmax(dim=-1), None
    # float32: q is both what the draft samples from and what verification divides by, so it must be one normalised
    # distribution (bf16 probabilities would not sum to 1, and the two would differ)
    probs = torch.softmax(at_least_float32(row_logits) / temperature, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1), probs


def _distributions(choices: torch.Tensor, probs: list[torch.Tensor], size: int, dtype: torch.dtype) -> torch.Tensor:
    """Stack per-slot sampling distributions, or the one-hot of greedy choices [N, B] -> [N, B, size]."""
    if probs:
        return torch.stack(probs, dim=1)
    return F.one_hot(choices, size).to(dtype)


@dataclass
class SelectorWalk:
    """What the Selector walk drafted.

    tokens [N, B]: draft-vocab indices; choices [N, B]: index of the chosen candidate in ``candidates``;
    candidates [N, B, k]; path_scores [N, B, k]: S_t(x_{t-1}, .) along the walked path (logits over C_t);
    probs [N, B, k]: the draft distribution q over C_t actually used (one-hot when greedy, else
    softmax(path_scores / T)); vocab_size: Vd.
    """

    tokens: torch.Tensor
    choices: torch.Tensor
    candidates: torch.Tensor
    path_scores: torch.Tensor
    probs: torch.Tensor
    vocab_size: int

    def full_probs(self) -> torch.Tensor:
        """q scattered over the whole draft vocabulary: [N, B, Vd], zero outside the candidate sets."""
        shape = (*self.candidates.shape[:2], self.vocab_size)
        return self.probs.new_zeros(shape).scatter_(-1, self.candidates, self.probs)


# The scan's batched argmax reads every k x k score (k times what the loop reads): it pays while the loop's fixed cost
# per op dominates, up to about 4 blocks of B = k = 16 on the project's CPU (equal at 8 blocks, 0.6x at 32).
_SCAN_MAX_SCORES = 4 * 16 * 16 * 16


def _greedy_choices(scores: torch.Tensor) -> torch.Tensor:
    """Greedy walk choices [N, B] from scores [N, B, k, k] in log2(B) rounds of gathers instead of B argmax steps.

    best[n, t, i] = argmax_j S_t(c_{t-1,i}, c_{t,j}) is one batched argmax (the same argmax over the same rows as the
    slot loop, so the same first-maximum choices), and the walk c_t = best_t(c_{t-1}), c_{-1} = 0, reads the
    composition best_t o ... o best_0 at 0. A doubling scan builds all those compositions: after the round with step
    d, maps[t] = best_t o ... o best_{t-2d+1}.
    """
    maps = scores.argmax(dim=-1)  # [N, B, k]
    step = 1
    while step < maps.shape[1]:
        # (f o g)(i) = f(g(i)): gather f = maps[t] at g = maps[t - step]
        maps = torch.cat((maps[:, :step], maps[:, step:].gather(-1, maps[:, :-step])), dim=1)
        step *= 2
    return maps[:, :, 0]


def walk_pair_scores(
    candidates: torch.Tensor,
    scores: torch.Tensor,
    *,
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
    vocab_size: int | None = None,
) -> SelectorWalk:
    """The sequential part of the Selector: walk precomputed ``pair_scores`` slot by slot (B cheap gathers).

    Small greedy walks (T = 0, e.g. one block while decoding) take no loop over slots: see ``_greedy_choices``.
    """
    _check_temperature(temperature)
    n_rows, block, k = candidates.shape
    if temperature == 0 and scores.numel() <= _SCAN_MAX_SCORES:
        choices_t = _greedy_choices(scores)
        previous = torch.cat((torch.zeros_like(choices_t[:, :1]), choices_t[:, :-1]), dim=1)  # c_{t-1}, c_{-1} = 0
        device = candidates.device
        rows = scores[torch.arange(n_rows, device=device)[:, None], torch.arange(block, device=device), previous]
        return SelectorWalk(
            tokens=candidates.gather(-1, choices_t[..., None]).squeeze(-1),
            choices=choices_t,
            candidates=candidates,
            path_scores=rows,
            probs=_distributions(choices_t, [], k, scores.dtype),
            vocab_size=int(vocab_size if vocab_size is not None else candidates.max().item() + 1),
        )
    choices, path_scores, probs = [], [], []
    previous = torch.zeros(n_rows, dtype=torch.long, device=candidates.device)  # slot 0: all rows are equal
    rows = torch.arange(n_rows, device=candidates.device)
    for slot in range(block):
        # advanced indexing, not gather: on CPU a gather over the strided [N, k, k] slice is ~10x slower
        row = scores[rows, slot, previous]
        previous, slot_probs = _choose(row, temperature, generator)
        choices.append(previous)
        path_scores.append(row)
        if slot_probs is not None:
            probs.append(slot_probs)
    choices_t = torch.stack(choices, dim=1)
    return SelectorWalk(
        tokens=candidates.gather(-1, choices_t[..., None]).squeeze(-1),
        choices=choices_t,
        candidates=candidates,
        path_scores=torch.stack(path_scores, dim=1),
        probs=_distributions(choices_t, probs, k, scores.dtype),
        vocab_size=int(vocab_size if vocab_size is not None else candidates.max().item() + 1),
    )


def selector_walk(
    base_logits: torch.Tensor,
    head: MarkovHead | None,
    first_prev: torch.Tensor,
    hidden: torch.Tensor | None,
    k: int,
    *,
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
    d2t: torch.Tensor | None = None,
    prev_gate_table: torch.Tensor | None | bool = None,
) -> SelectorWalk:
    """``pair_scores`` then the walk; returns tokens plus the per-slot draft distributions over the candidates."""
    candidates, scores = pair_scores(base_logits, head, first_prev, hidden, k, d2t=d2t, prev_gate_table=prev_gate_table)
    return walk_pair_scores(
        candidates, scores, temperature=temperature, generator=generator, vocab_size=base_logits.shape[-1]
    )


def selector_decode(
    base_logits: torch.Tensor,
    head: MarkovHead | None,
    first_prev: torch.Tensor,
    hidden: torch.Tensor | None,
    k: int,
    **options,
) -> torch.Tensor:
    """Selector decode of a block: tokens [N, B] (draft-vocab indices). ``options`` are ``selector_walk``'s
    (``temperature``, ``generator``, ``d2t``, ``prev_gate_table``); see there for the details."""
    return selector_walk(base_logits, head, first_prev, hidden, k, **options).tokens


@dataclass
class SequentialWalk:
    """What the sequential (full-vocabulary) Markov decode drafted.

    tokens [N, B] (draft indices); logits [N, B, Vd]: U_t + bias_t(x_{t-1}) along the decoded path; probs [N, B, Vd]:
    the draft distribution q used at each slot (one-hot when greedy, else softmax(logits / T)).
    """

    tokens: torch.Tensor
    logits: torch.Tensor
    probs: torch.Tensor


def _sequential(
    base_logits: torch.Tensor,
    head: MarkovHead | None,
    first_prev: torch.Tensor,
    hidden: torch.Tensor | None,
    *,
    keep_distributions: bool,
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
    d2t: torch.Tensor | None = None,
) -> torch.Tensor | SequentialWalk:
    _check_temperature(temperature)
    _check_inputs(base_logits, head, first_prev, hidden, d2t)
    state = None
    prev = first_prev
    tokens, logits_per_slot, probs_per_slot = [], [], []
    for slot in range(base_logits.shape[1]):
        logits = base_logits[:, slot]
        if head is not None:
            bias, state = head.step_bias(prev, None if hidden is None else hidden[:, slot], state)
            logits = logits + bias
        token, probs = _choose(logits, temperature, generator)
        tokens.append(token)
        if keep_distributions:
            logits_per_slot.append(logits)
            if probs is not None:
                probs_per_slot.append(probs)
        prev = _to_target_ids(token, d2t)
    tokens_t = torch.stack(tokens, dim=1)
    if not keep_distributions:
        return tokens_t
    logits_t = torch.stack(logits_per_slot, dim=1)
    return SequentialWalk(
        tokens_t, logits_t, _distributions(tokens_t, probs_per_slot, logits_t.shape[-1], logits_t.dtype)
    )


def sequential_decode(
    base_logits: torch.Tensor,
    head: MarkovHead | None,
    first_prev: torch.Tensor,
    hidden: torch.Tensor | None,
    *,
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
    d2t: torch.Tensor | None = None,
) -> torch.Tensor:
    """Reference decode: slot by slot, x_t = argmax (or a sample at T > 0) of U_t + bias_t(x_{t-1}) over all of Vd.

    Works for every head type (the rnn state is carried across slots) and ``head=None``. Returns tokens [N, B]
    (draft indices); ``first_prev`` is a target id and drafted tokens are fed back through ``d2t``.
    """
    return _sequential(
        base_logits,
        head,
        first_prev,
        hidden,
        keep_distributions=False,
        temperature=temperature,
        generator=generator,
        d2t=d2t,
    )


def sequential_walk(
    base_logits: torch.Tensor,
    head: MarkovHead | None,
    first_prev: torch.Tensor,
    hidden: torch.Tensor | None,
    **options,
) -> SequentialWalk:
    """``sequential_decode`` (same ``options``: ``temperature``, ``generator``, ``d2t``) that also returns the
    calibrated logits and the draft distribution q per slot."""
    return _sequential(base_logits, head, first_prev, hidden, keep_distributions=True, **options)
