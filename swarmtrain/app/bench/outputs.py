"""What ``swarmtrain bench strategies`` writes: the table, strict JSON, a CSV, the Pareto plot (final
validation loss against bytes per token, 95 % error bars over seeds) and the curves (validation loss
against cumulative bytes one worker sent, log x, one line per point, a band for the interval); with
``meta["link"]`` also the curves against a modelled wall-clock over that link
(``swarmtrain.app.bench.link``: modelled, not measured).

The first row is the reference (fp32 DataParallel). Rows of one seed have no interval
(``val_loss_ci95`` is ``None``, ``null`` in JSON) and render as before seeds existed.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from swarmtrain.core.jsonsafe import dumps, finite

__all__ = ["write_outputs", "curves_path", "wallclock_path", "table_lines", "markdown_table"]


def curves_path(json_path: Path) -> Path:
    """Where the curves' PNG goes: beside the JSON, ``<stem>_curves.png``."""
    return json_path.with_name(f"{json_path.stem}_curves.png")


def _cell(v: Any) -> Any:
    """A CSV cell: lists and dicts as JSON, the rest as it is."""
    return json.dumps(v) if isinstance(v, list | dict) else v


def write_outputs(rows: list[dict[str, Any]], meta: dict[str, Any], json_path: Path) -> list[Path]:
    """JSON (``json_path``), a CSV (the rows without their curves), the Pareto PNG and the curves' PNG
    beside it. Returns what was written (the curves only when some row has a curve)."""
    link = _link(meta)
    if link is not None:
        _add_times(rows, int(meta["steps"]), link)
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(dumps({"settings": meta, "rows": rows}, indent=2) + "\n", encoding="utf-8")
    csv_path = json_path.with_suffix(".csv")
    keys: list[str] = []
    for r in rows:
        keys += [k for k in r if k not in keys and k != "curve"]
    with csv_path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=keys)
        writer.writeheader()
        writer.writerows({k: _cell(v) for k, v in r.items() if k != "curve"} for r in finite(rows))
    png = json_path.with_suffix(".png")
    _plot(rows, meta, png)
    written = [json_path, csv_path, png]
    if any(r.get("curve") for r in rows):
        written.append(curves_path(json_path))
        _plot_curves(rows, meta, written[-1])
        if link is not None:
            written.append(wallclock_path(json_path))
            _plot_wallclock(rows, meta, link, written[-1])
    return written


def wallclock_path(json_path: Path) -> Path:
    """Where the modelled wall-clock curves' PNG goes: beside the JSON, ``<stem>_wallclock.png``."""
    return json_path.with_name(f"{json_path.stem}_wallclock.png")


def _link(meta: dict[str, Any]) -> Any:
    """The emulated link ``meta["link"]`` describes (``Link.as_json``), or ``None``."""
    from swarmtrain.app.bench.link import Link

    given = meta.get("link")
    return Link(float(given["bandwidth_bit_s"]), float(given["rtt_s"])) if given else None


def _add_times(rows: list[dict[str, Any]], steps: int, link: Any) -> None:
    """Each curve point's modelled wall-clock seconds over ``link`` (``modelled_wall_s``)."""
    from swarmtrain.app.bench.link import modelled_times

    for r in rows:
        for c, t in zip(r.get("curve") or (), modelled_times(r, steps, link), strict=True):
            c["modelled_wall_s"] = t


def _plot_wallclock(rows: list[dict[str, Any]], meta: dict[str, Any], link: Any, path: Path) -> None:
    """Validation loss against the modelled wall-clock over ``link``, per point (beside the bytes')."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    for i, r in enumerate(rows):
        curve = [c for c in r.get("curve") or () if c.get("modelled_wall_s") and c["val_loss"] is not None]
        if not curve:
            continue
        style = {"color": "black", "lw": 2} if i == 0 else {"lw": 1.2}
        xs, ys = [c["modelled_wall_s"] for c in curve], [c["val_loss"] for c in curve]
        (line,) = ax.plot(xs, ys, marker=".", label=r["label"], **style)
        cis = [c.get("val_loss_ci95") for c in curve]
        if all(ci is not None for ci in cis):
            lo = [y - ci for y, ci in zip(ys, cis, strict=True)]
            hi = [y + ci for y, ci in zip(ys, cis, strict=True)]
            ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.15, lw=0)
    ax.set_xscale("log")
    ax.set_xlabel(f"modelled wall-clock over {link.label()}, s (log; not measured)")
    ax.set_ylabel("validation loss")
    ax.set_title(_title(meta), fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _title(meta: dict[str, Any]) -> str:
    seeds = f", {meta['seeds']} seeds (95 % t-interval)" if (meta.get("seeds") or 1) > 1 else ""
    run = f"{meta['workers']} workers x {meta['steps']} steps of batch {meta['batch_size']}"
    return f"{run} ({meta['preset']}){seeds}"


def _plot(rows: list[dict[str, Any]], meta: dict[str, Any], path: Path) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    front = sorted((r for r in rows if r.get("pareto")), key=lambda r: r["bytes_per_token"])
    for i, r in enumerate(rows):
        x, y = r["bytes_per_token"], r["final_val_loss"]
        color = "black" if i == 0 else ("tab:red" if r.get("pareto") else "tab:blue")
        ax.scatter(x, y, marker="*" if i == 0 else "o", s=160 if i == 0 else 40, color=color, zorder=3)
        if r.get("val_loss_ci95") is not None:
            ax.errorbar(x, y, yerr=r["val_loss_ci95"], fmt="none", ecolor=color, capsize=3, zorder=2)
        ax.annotate(r["label"], (x, y), fontsize=7, xytext=(4, 3), textcoords="offset points")
    if len(front) > 1:
        ax.plot(
            [r["bytes_per_token"] for r in front],
            [r["final_val_loss"] for r in front],
            color="tab:red",
            lw=1,
            zorder=2,
            label="Pareto front",
        )
        ax.legend()
    ax.set_xscale("log")
    ax.set_xlabel("bytes sent per token per worker (log)")
    ax.set_ylabel("final validation loss")
    ax.set_title(_title(meta), fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _plot_curves(rows: list[dict[str, Any]], meta: dict[str, Any], path: Path) -> None:
    """Validation loss against the bytes one worker had sent by each recorded sync, per point."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    for i, r in enumerate(rows):
        curve = [c for c in r.get("curve") or () if c["bytes"] > 0 and c["val_loss"] is not None]
        if not curve:
            continue
        xs = [c["bytes"] for c in curve]
        ys = [c["val_loss"] for c in curve]
        style = {"color": "black", "lw": 2} if i == 0 else {"lw": 1.2}
        (line,) = ax.plot(xs, ys, marker=".", label=r["label"], **style)
        cis = [c.get("val_loss_ci95") for c in curve]
        if all(ci is not None for ci in cis):
            lo = [y - ci for y, ci in zip(ys, cis, strict=True)]
            hi = [y + ci for y, ci in zip(ys, cis, strict=True)]
            ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.15, lw=0)
    ax.set_xscale("log")
    ax.set_xlabel("cumulative bytes sent per worker (log)")
    ax.set_ylabel("validation loss")
    ax.set_title(_title(meta), fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _pm(value: float, ci: float | None, fmt: str) -> str:
    """``value`` in ``fmt``, with ``±ci`` when there is an interval."""
    return format(value, fmt) + ("" if ci is None else "±" + format(ci, fmt.lstrip("+")))


def table_lines(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The rows as plain text that fits 80 columns (labels wrap onto their own line when long). Loss
    and gap carry ``±`` the half-width of their 95 % interval with several seeds; a codec row with a
    fp32 control has a line with its gap to that control (the codec's part)."""
    head = f"{'':29} {'val loss':>14} {'gap':>13} {'B/token':>9} {'less':>6} {'same':>4}"
    lines = [head, "-" * len(head)]
    for r in rows:
        red = r.get("reduction_vs_dp")
        cells = (
            f"{_pm(r['final_val_loss'], r.get('val_loss_ci95'), '.4f'):>14} "
            f"{_pm(r['gap_vs_dp'], r.get('gap_vs_dp_ci95'), '+.2%'):>13} {r['bytes_per_token']:>9.2f} "
            f"{(f'{red:.0f}x' if red else '-'):>6} {'yes' if r['params_identical'] else 'NO':>4}"
        )
        mark = "*" if r.get("pareto") else " "
        label = f"{mark}{r['label']}"
        if len(label) > 29:
            lines.append(label)
            label = ""
        lines.append(f"{label:29} {cells}")
        if "gap_vs_control" in r:
            gap = _pm(r["gap_vs_control"], r.get("gap_vs_control_ci95"), "+.2%")
            lines.append(f"{'  vs its fp32 control':29} {'':>14} {gap:>13}")
        if "real_final_val_loss" in r:
            real_gap = r.get("real_gap_vs_dp")
            lines.append(
                f"{'  real peers':29} {r['real_final_val_loss']:>14.4f} "
                f"{(f'{real_gap:+.2%}' if real_gap is not None else ''):>13} "
                f"{r['real_bytes_per_token']:>9.2f}"
                f" {'':>6} {'yes' if r['real_params_identical'] else 'NO':>4}"
            )
    seeds = max((r.get("seeds") or 1) for r in rows) if rows else 1
    if seeds > 1:
        lines.append(f"±: half-width of the 95 % t-interval over {seeds} seeds (gaps paired by seed)")
    lines.append("* on the Pareto front (no other point has both lower loss and fewer bytes)")
    return lines


def markdown_table(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The rows as the README's Markdown table (real-peer re-runs as rows of their own). With several
    seeds, loss and gap carry ``±`` their 95 % half-width; with controls, a column of each codec
    row's gap to its fp32 control."""
    controls = any("gap_vs_control" in r for r in rows)
    extra = (" vs fp32 control |", "---|") if controls else ("", "")
    out = [
        f"| point | val loss | vs DataParallel |{extra[0]} bytes / token / worker | fewer bytes "
        "| identical |",
        f"|---|---|---|{extra[1]}---|---|---|",
    ]
    for r in rows:
        red = r.get("reduction_vs_dp")
        same = "yes" if r["params_identical"] else "NO"
        loss = _pm(r["final_val_loss"], r.get("val_loss_ci95"), ".4f").replace("±", " ± ")
        gap = _pm(r["gap_vs_dp"], r.get("gap_vs_dp_ci95"), "+.2%").replace("±", " ± ")
        control = ""
        if controls:
            gc = r.get("gap_vs_control")
            control = " - |" if gc is None else f" {_pm(gc, r.get('gap_vs_control_ci95'), '+.2%')} |"
            control = control.replace("±", " ± ")
        out.append(
            f"| {r['label']} | {loss} | {gap} |{control} "
            f"{r['bytes_per_token']:,.2f} | {f'{red:,.0f}x' if red else '-'} | {same} |"
        )
        if "real_final_val_loss" in r:
            gap = r.get("real_gap_vs_dp", 0.0)  # the reference's own real run: 0 by definition
            same = "yes" if r["real_params_identical"] else "NO"
            ref_bytes = rows[0].get("real_bytes_per_token")
            red = ref_bytes / r["real_bytes_per_token"] if ref_bytes and r["real_bytes_per_token"] else None
            out.append(
                f"| {r['label']}, real peers | {r['real_final_val_loss']:.4f} | {gap:+.2%} |"
                f"{' - |' if controls else ''} "
                f"{r['real_bytes_per_token']:,.2f} (ledger) | {f'{red:,.0f}x' if red else '-'} | {same} |"
            )
    return out
