"""``benchmarks/gpu.py``'s printed table: sections, status, goals met, headline figures, 80 columns."""

from __future__ import annotations

from typing import Any

SECTIONS = ("strategies", "codecs", "swarm", "local_loop", "memory", "dct")
WIDTH = 80  # the printed table's columns at most

__all__ = ["SECTIONS", "WIDTH", "table"]


def _fit(text: str) -> str:
    return text if len(text) <= WIDTH else text[: WIDTH - 3] + "..."


def _mib(x: Any) -> str:
    return f"{x / 2**20:.1f} MiB" if isinstance(x, int | float) else "- MiB"


def _num(x: Any, fmt: str) -> str:
    return format(x, fmt) if isinstance(x, int | float) and not isinstance(x, bool) else "-"


def _yes(x: Any) -> str:
    return {True: "yes", False: "NO"}.get(x, "-")


def _strategy_lines(sec: dict[str, Any]) -> list[str]:
    lines = []
    for name, r in sec.get("runs", {}).items():
        if r.get("status") != "measured":
            lines.append(f"  {name:17s} {r.get('status', '?')} {r.get('error', '')}")
            continue
        lines.append(
            f"  {name:17s} loss {_num(r['final_val_loss'], '.3f')}  identical {_yes(r['params_identical'])}"
            f"  {_mib(r['bytes_sent_per_peer'])}/peer  {_num(r['wall_s'], '.0f')} s"
        )
    return lines


def _figures(name: str, sec: dict[str, Any]) -> str:
    """The section's headline figures (one line)."""
    if name == "strategies":
        return f"2 peers on {sec['device']}, {sec['preset']}, {sec['steps']} steps of {sec['batch']}"
    if name == "codecs" and isinstance(sec.get("codecs"), dict):  # gpu_codecs' figures
        return ", ".join(
            f"{k} {_num(v.get('compress', {}).get('gbps'), '.1f')}/"
            f"{_num(v.get('decompress', {}).get('gbps'), '.1f')} GB/s"
            for k, v in sec["codecs"].items()
            if isinstance(v, dict)
        )
    if name == "codecs":
        res = sec.get("results")
        rows = res.values() if isinstance(res, dict) else []
        if rows and all(isinstance(v, dict) and "compress_roofline" in v for v in rows):
            return ", ".join(f"{k} {_num(v['compress_roofline'], '.2f')}" for k, v in res.items())
        return sec.get("source", "")
    if name == "swarm":
        devs = sorted({str(d) for d in sec["server_devices"].values()}) or ["?"]
        return (
            f"loss {_num(sec['final_val_loss'], '.3f')} identical {_yes(sec['params_identical'])} "
            f"on {'/'.join(devs)} {_num(sec['wall_s'], '.0f')} s"
        )
    if name == "local_loop":
        parts = []
        for k, v in sec["runs"].items():
            if v.get("status") == "measured":
                mfu = f" MFU {v['mfu']:.1%}" if v.get("mfu") is not None else ""
                parts.append(f"{k} B{v['batch']} x{v['ratio_trainer_over_minimal']:.2f}{mfu}")
        return ", ".join(parts)
    if name == "memory":
        return ", ".join(
            f"{r['key']} x{r['measured_over_predicted']:.2f}" for r in sec["rows"] if "measured_bytes" in r
        )
    if name == "dct":
        return f"extract {sec['extract_gbps']:.2f} GB/s ({sec['extract_over_copy_time']:.3f} of a copy)"
    return ""


def _goal_cell(sec: dict[str, Any]) -> str:
    goals = [g for g in sec.get("goals", {}).values() if isinstance(g, dict) and g.get("met") is not None]
    return f"{sum(1 for g in goals if g['met'])}/{len(goals)}" if goals else "-"


def table(record: dict[str, Any]) -> str:
    """Sections, their status, goals met / applicable, headline figures: at most 80 columns."""
    lines = [f"{'section':11s} {'status':9s} {'goals':5s} figures"]
    for name in SECTIONS:
        sec = record["sections"].get(name, {"status": "not run"})
        status = str(sec.get("status", "?"))
        measured = status == "measured"
        fig = _figures(name, sec) if measured else sec.get("error", status)
        lines.append(f"{name:11s} {status[:9]:9s} {_goal_cell(sec):5s} {fig}")
        if name == "strategies" and measured:
            lines += _strategy_lines(sec)
    return "\n".join(_fit(line) for line in lines)
