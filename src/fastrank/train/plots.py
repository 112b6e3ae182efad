"""Training curves as PNG files (matplotlib, Agg backend: no display needed)."""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional

__all__ = ["plot_curves"]


def plot_curves(histories: Dict[str, List[Dict]], key: str, path, title: str, ylabel: str,
                logy: bool = False) -> Optional[Path]:
    """One line per run: ``histories[name]`` is a trainer history (records with "epoch" and
    possibly ``key``); epochs without ``key`` are skipped. Writes ``path``; returns it, or
    None when no run has the key."""
    import matplotlib
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    series = {name: ([r["epoch"] for r in h if key in r], [r[key] for r in h if key in r])
              for name, h in histories.items()}
    series = {n: s for n, s in series.items() if s[0]}
    if not series:
        return None
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=110)
    for name, (x, y) in series.items():
        ax.plot(x, y, marker="o", label=name)
    ax.set_xlabel("epoch")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if logy:
        ax.set_yscale("log")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
