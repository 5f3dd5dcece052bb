"""Drawing primitives of ``docs/img/architecture.py``: package colours, boxes, arrows, a canvas."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402

HERE = Path(__file__).resolve().parent

# one colour per package, the same in every picture
COLORS = {
    "core": "#e8e8e8",
    "compression": "#fde2b8",
    "optimizers": "#cfe8c6",
    "peers": "#cfe0f5",
    "wire": "#e3d7f2",
    "reducers": "#f7d0d0",
    "app": "#fff6b3",
    "simulation": "#f2f2f2",
    "outside": "#ffffff",
}


def box(
    ax: Axes,
    x: float,
    y: float,
    w: float,
    h: float,
    title: str,
    body: str = "",
    color: str = "#ffffff",
    *,
    size: float = 9.0,
    dashed: bool = False,
) -> tuple[float, float, float, float]:
    """A rounded box at ``(x, y)`` (lower left) with a bold title and a smaller body; returns it."""
    ax.add_patch(
        FancyBboxPatch(
            (x, y),
            w,
            h,
            boxstyle="round,pad=0.02,rounding_size=0.08",
            facecolor=color,
            edgecolor="#444444",
            linewidth=1.0,
            linestyle="--" if dashed else "-",
        )
    )
    if body:
        ax.text(x + w / 2, y + h - 0.12, title, ha="center", va="top", fontsize=size + 1, weight="bold")
        ax.text(x + w / 2, y + h - 0.42, body, ha="center", va="top", fontsize=size, linespacing=1.35)
    else:
        ax.text(x + w / 2, y + h / 2, title, ha="center", va="center", fontsize=size + 1, weight="bold")
    return (x, y, w, h)


def arrow(
    ax: Axes,
    a: tuple[float, float],
    b: tuple[float, float],
    label: str = "",
    *,
    color: str = "#333333",
    style: str = "-|>",
    dashed: bool = False,
    rad: float = 0.0,
    size: float = 8.0,
    label_at: float = 0.5,
    offset: tuple[float, float] = (0.0, 0.0),
) -> None:
    """An arrow from ``a`` to ``b`` with an optional label near its middle."""
    ax.add_patch(
        FancyArrowPatch(
            a,
            b,
            arrowstyle=style,
            mutation_scale=12,
            color=color,
            linewidth=1.2,
            linestyle="--" if dashed else "-",
            connectionstyle=f"arc3,rad={rad}",
        )
    )
    if label:
        mx = a[0] + (b[0] - a[0]) * label_at + offset[0]
        my = a[1] + (b[1] - a[1]) * label_at + offset[1]
        ax.text(
            mx,
            my,
            label,
            ha="center",
            va="center",
            fontsize=size,
            color=color,
            bbox={"facecolor": "white", "edgecolor": "none", "pad": 1.0, "alpha": 0.9},
        )


def top(b: tuple[float, float, float, float], f: float = 0.5) -> tuple[float, float]:
    return (b[0] + b[2] * f, b[1] + b[3])


def bottom(b: tuple[float, float, float, float], f: float = 0.5) -> tuple[float, float]:
    return (b[0] + b[2] * f, b[1])


def left(b: tuple[float, float, float, float], f: float = 0.5) -> tuple[float, float]:
    return (b[0], b[1] + b[3] * f)


def right(b: tuple[float, float, float, float], f: float = 0.5) -> tuple[float, float]:
    return (b[0] + b[2], b[1] + b[3] * f)


def canvas(w: float, h: float, title: str) -> tuple[plt.Figure, Axes]:
    fig, ax = plt.subplots(figsize=(w, h))
    ax.set_xlim(0, w)
    ax.set_ylim(0, h)
    ax.axis("off")
    ax.text(w / 2, h - 0.25, title, ha="center", va="top", fontsize=15, weight="bold")
    return fig, ax


def save(fig: plt.Figure, name: str) -> None:
    fig.savefig(HERE / name, dpi=110, bbox_inches="tight", facecolor="white")
    plt.close(fig)


def legend(ax: Axes, x: float, y: float, names: list[tuple[str, str]]) -> None:
    """Colour swatches naming the package of each box, in one row from ``(x, y)``."""
    for label, key in names:
        ax.add_patch(
            FancyBboxPatch(
                (x, y),
                0.35,
                0.25,
                boxstyle="square,pad=0",
                facecolor=COLORS[key],
                edgecolor="#444444",
                linewidth=0.8,
            )
        )
        ax.text(x + 0.45, y + 0.12, label, va="center", fontsize=8.5)
        x += 0.45 + 0.085 * len(label) + 0.5
