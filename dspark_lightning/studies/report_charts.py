"""The charts of the demo and recipe reports: acceptance per slot, tau per head and the Selector's coverage."""

from __future__ import annotations

from pathlib import Path


def plot_results(rows: list[dict], output: Path, k: int) -> list[str]:
    """acceptance_per_slot.png, tau.png and (when a Selector-form head ran) selector.png; returns the file names."""
    import matplotlib.pyplot as plt

    from dspark_lightning import plotting  # noqa: F401  (deferred like matplotlib itself; selects the Agg backend)

    written = []
    block_sizes = sorted({r["block_size"] for r in rows})
    fig, axes = plt.subplots(1, len(block_sizes), figsize=(5.2 * len(block_sizes), 3.6), squeeze=False)
    for ax, block in zip(axes[0], block_sizes):
        for r in (r for r in rows if r["block_size"] == block):
            ax.plot(
                range(block), r["accept_rate_per_slot"], marker="o", label=f"{r['head']} (tau {r['teacher_tau']:.2f})"
            )
        ax.set(title=f"B = {block}: acceptance rate per slot", xlabel="draft slot k", ylabel="accept rate", ylim=(0, 1))
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    written.append(plotting.save(fig, output / "acceptance_per_slot.png"))

    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(rows)), 3.8))
    series = [
        ("teacher-forced tau", "teacher_tau"),
        ("teacher-forced greedy tau", "teacher_greedy_tau"),
        ("measured tau (greedy decoding)", "measured_tau"),
    ]
    width = 0.8 / len(series)
    for i, (label, key) in enumerate(series):
        xs = [j + (i - (len(series) - 1) / 2) * width for j in range(len(rows))]
        ax.bar(xs, [r[key] for r in rows], width=width, label=label)
    ax.set_xticks(range(len(rows)), [f"{r['head']}\nB={r['block_size']}" for r in rows])
    ax.axhline(1.0, color="gray", lw=0.8)
    top = max(r[key] for r in rows for _, key in series)
    ax.set(ylabel="tokens per target forward", title="acceptance length per head and block size", ylim=(0, 1.3 * top))
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, ncol=3, loc="upper center")
    fig.tight_layout()
    written.append(plotting.save(fig, output / "tau.png"))

    with_selector = [r for r in rows if r.get("selector")]
    if with_selector:
        fig, ax = plt.subplots(figsize=(6, 3.8))
        for r in with_selector:
            s = r["selector"]
            (line,) = ax.plot(s["ks"], s["coverage"], marker="o", label=f"{r['head']} B={r['block_size']} coverage")
            ax.plot(s["ks"], s["agreement"], marker="x", ls="--", color=line.get_color(), label="  agreement")
        ax.axvline(k, color="gray", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set(xlabel="k (candidates per slot)", ylabel="fraction of slots", title="Selector walk vs sequential decode")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
        fig.tight_layout()
        written.append(plotting.save(fig, output / "selector.png"))
    return [Path(p).name for p in written]
