"""Where the train/serve acceptance gap comes from: the training metric, moved one step at a time to measured tau.

The four steps and why each delta is what one difference costs: docs/design/design.md §7.9."""

from __future__ import annotations

from dspark_lightning.measuring.identity import record_decode, teacher_forced_blocks

STEPS = (
    ("a", "validation text", "text", "every stride-th reply position"),
    ("b", "target's greedy reply", "text (the target's)", "every stride-th reply position"),
    ("c", "target's greedy reply", "drafter's own", "every stride-th reply position"),
    ("d", "target's greedy reply", "drafter's own", "decoding's block starts"),
)


def _strided(start: int, stop: int, stride: int) -> list[int]:
    """Positions in [start, stop) at multiples of ``stride`` (in-document positions, as evaluation anchors)."""
    return [p for p in range(start, stop) if p % stride == 0]


def gap_decomposition(
    target,
    drafter,
    prompts: list[list[int]],
    references: list[tuple[list[int], list[bool]]],
    max_new_tokens: int,
    mode: str | None = None,
    k: int = 16,
    stride: int | None = None,
    eos_token_id=None,
) -> dict:
    """Greedy tau at steps (a)-(d) and measured, over all prompts (blocks pooled, like ``DecodeStats.merge``).

    ``references[i]`` is the validation conversation of ``prompts[i]`` up to its first reply: ids and loss mask.
    ``mode``: ``markov`` for a drafter with a Markov head, else ``parallel`` (then (c) equals (b) by construction).
    """
    mode = mode or ("markov" if drafter.markov_head is not None else "parallel")
    stride = stride or 1
    B = drafter.block_size
    accepted: dict[str, list[int]] = {step: [] for step, *_ in STEPS} | {"measured": []}
    for prompt, (ref_ids, ref_mask) in zip(prompts, references):
        start = next((i for i, m in enumerate(ref_mask) if m), len(ref_mask))
        # (a) the reply's first max_new_tokens tokens; a block must fit inside the reply
        stop = min(start + max_new_tokens, len(ref_ids) - B)
        ref_anchors = [p for p in _strided(start, stop, stride) if all(ref_mask[p : p + B + 1])]
        a = teacher_forced_blocks(target, drafter, ref_ids, ref_anchors, 0, mode, k, "teacher", loss_mask=ref_mask)
        accepted["a"] += a.metric_accepted
        record = record_decode(target, drafter, prompt, max_new_tokens, mode, k, eos_token_id)
        L = record.prompt_length
        anchors = _strided(L, len(record.output), stride)
        for step, prev, where in (
            ("b", "teacher", anchors),
            ("c", "own", anchors),
            ("d", "own", record.anchor_positions),
        ):
            blocks = teacher_forced_blocks(target, drafter, record.text, where, L, mode, k, prev)
            accepted[step] += blocks.metric_accepted
        accepted["measured"] += record.accepted
    taus = {step: sum(a + 1 for a in values) / max(1, len(values)) for step, values in accepted.items()}
    blocks = {step: len(values) for step, values in accepted.items()}
    harmonic = len(accepted["c"]) / max(1e-12, sum(1 / (a + 1) for a in accepted["c"]))
    return dict(
        mode=mode,
        stride=stride,
        prompts=len(prompts),
        max_new_tokens=max_new_tokens,
        tau=taus,
        blocks=blocks,
        harmonic_c=harmonic,
    )


def gap_markdown(result: dict) -> str:
    """The decomposition as a markdown table: each step, its tau and its delta from the step before."""
    lines = [
        f"Greedy tau (training metric) over the first {result['max_new_tokens']} reply tokens of "
        f"{result['prompts']} eval prompts, `{result['mode']}` mode, stride {result['stride']}.",
        "",
        "| step | text | previous tokens | anchors | blocks | greedy tau | delta |",
        "|---|---|---|---|---:|---:|---:|",
    ]
    previous = None
    for step, text, prev, anchors in STEPS:
        tau = result["tau"][step]
        delta = "" if previous is None else f"{tau - previous:+.3f}"
        lines.append(f"| ({step}) | {text} | {prev} | {anchors} | {result['blocks'][step]} | {tau:.3f} | {delta} |")
        previous = tau
    measured = result["tau"]["measured"]
    lines.append(
        f"| measured | decoding | drafter's own | decoding's block starts | {result['blocks']['measured']} | "
        f"{measured:.3f} | {measured - previous:+.3f} |"
    )
    lines += [
        "",
        f"Harmonic mean of (1 + accepted) over the blocks of (c): {result['harmonic_c']:.3f} (tokens per forward if "
        "acceptance were constant over stretches of text; the arithmetic mean (c) is the value with no persistence).",
    ]
    return "\n".join(lines) + "\n"
