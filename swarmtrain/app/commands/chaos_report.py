"""What ``simulate --chaos`` reports, for every strategy: the JSON fields and the lines printed.

``main`` and ``clean`` are the results of the chaos run and of the same configuration without chaos
(``swarmtrain.simulation.results.SimulationResult`` or ``swarmtrain.simulation.swarm.SwarmResult``:
both carry the fault counts, the timeline, the rounds, ``params_identical`` and ``final_val_loss``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["chaos_fields", "chaos_line", "events_text"]


def chaos_fields(main: Any, clean: Any, chaos: Any) -> dict[str, Any]:
    """The JSON fields of a chaos run: the spec, the faults' counts and timeline, the survivors'
    agreement and loss against the clean run of the same configuration."""
    return {
        "chaos": chaos.text,
        "kills": main.kills,
        "preemptions": main.preemptions,
        "restarts": main.restarts,
        "deaths": main.deaths,
        "missing_ranks": main.missing_ranks,
        "rounds_committed": main.rounds_committed,
        "rounds_failed": main.rounds_failed,
        "clean_rounds_committed": clean.rounds_committed,
        "clean_rounds_failed": clean.rounds_failed,
        "params_identical": main.params_identical,
        "final_val_loss": main.final_val_loss,
        "clean_val_loss": clean.final_val_loss,
        "loss_vs_clean": main.final_val_loss / clean.final_val_loss - 1.0,  # (dumps nulls a NaN)
        "timeline": main.timeline,
    }


def events_text(timeline: list[dict[str, Any]]) -> str:
    """``kill peer2 @41s, restart peer2 @56s, ...`` (the first eight)."""
    parts = [f"{e['event']} peer{e['rank']} @{e['t']:.0f}s" for e in timeline[:8]]
    return ", ".join(parts) + (f", ... ({len(timeline)} in all)" if len(timeline) > 8 else "")


def chaos_line(out: dict[str, Any]) -> str:
    """Two lines of at most 80 columns: the faults, then the survivors against the clean run."""
    first = (
        f"chaos: {out['kills']} kills, {out['preemptions']} preemptions, {out['restarts']} restarts, "
        f"{out['deaths']} other deaths"
    )
    ratio = out["loss_vs_clean"]
    vs = f"{ratio * 100:+.1f}%" if ratio == ratio else "n/a"
    second = (
        f"  val loss {out['final_val_loss']:.4f} vs clean {out['clean_val_loss']:.4f} ({vs}); "
        f"identical: {'yes' if out['params_identical'] else 'NO'}"
    )
    return f"{first}\n{second}"
