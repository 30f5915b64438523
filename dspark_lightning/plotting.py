"""Matplotlib figures shared by callbacks, the report and the notebooks (hence at the package root).

No backend is forced: headless machines get matplotlib's automatic Agg fallback, notebooks keep inline figures.

Each function takes plain numbers (lists / 1-D tensors) and returns a ``matplotlib.figure.Figure``; saving and
logging are the caller's business. Curves with NaN entries (slots or bins without data) are drawn with gaps.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt


def _values(x) -> list[float]:
    return [float(v) for v in (x.tolist() if hasattr(x, "tolist") else x)]


def per_slot_chart(curves: Mapping[str, Sequence[float]], title: str, ylabel: str = "rate"):
    """One line per named curve over draft slots (e.g. accept_rate and greedy_acc, or one line per head)."""
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for name, values in curves.items():
        ys = _values(values)
        ax.plot(range(len(ys)), ys, marker="o", label=name)
    ax.set_xlabel("draft slot k")
    ax.set_ylabel(ylabel)
    ax.set_ylim(0, 1.02)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return fig


def reliability_diagram(confidence: Sequence[float], observed: Sequence[float], counts: Sequence[float], title: str):
    """Mean predicted prefix survival vs observed prefix acceptance per confidence bin, with bin counts."""
    conf, obs, n = _values(confidence), _values(observed), _values(counts)
    fig, (ax, ax_n) = plt.subplots(2, 1, figsize=(5, 5), sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    ax.plot([0, 1], [0, 1], "--", color="gray", label="perfect calibration")
    ax.plot(conf, obs, marker="o", label="model")
    ax.set_ylabel("observed prefix acceptance")
    ax.set_title(title)
    ax.legend()
    ax.grid(alpha=0.3)
    width = 1.0 / max(1, len(n))
    ax_n.bar([(i + 0.5) * width for i in range(len(n))], n, width=width * 0.9)
    ax_n.set_xlabel("predicted prefix survival")
    ax_n.set_ylabel("slots")
    fig.tight_layout()
    return fig


def xy_chart(
    xs: Sequence[float] | None,
    curves: Mapping[str, Sequence[float]],
    title: str,
    xlabel: str,
    ylabel: str,
    logx=False,
    curve_xs: Mapping[str, Sequence[float]] | None = None,
):
    """Generic line chart (coverage vs k, tau vs threshold, loss vs step ...); ``curve_xs`` gives a curve its own x
    values (runs validated at different steps), else it uses ``xs``."""
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for name, ys in curves.items():
        ax.plot(_values((curve_xs or {}).get(name, xs)), _values(ys), marker="o", label=name)
    if logx:
        ax.set_xscale("log", base=2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return fig


def save(fig, path) -> str:
    from pathlib import Path

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)
