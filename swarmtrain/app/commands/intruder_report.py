"""What ``simulate --intruders K --colluders C`` reports: the JSON fields and the lines printed.

Three runs of one configuration, each with the same newcomer event (the last rank preempted and
restarted mid-run, so a state is downloaded while the attacks go on): ``clean`` (no attack),
``main`` (the attacks against every defence) and ``control`` (the same attacks, the peers taking
states by the rules before commit certificates and reducing senders' weights as claimed). With
colluders, rank 0 of the attacked runs is an admitted member claiming weight 1e30 (left out of the
honest peers). ``intruder_effects`` must all be 0; the control's
``control_effects`` show that the attacks can act at all, so that zero effects mean something.
"""

from __future__ import annotations

from typing import Any

__all__ = ["CONTROL", "intruder_fields"]

#: what the control run turns off (the JSON's ``control``)
CONTROL = "states taken without commit certificates, weights reduced without the cap"


def _effects_text(effects: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in effects.items() if v) or "none"


def intruder_fields(
    main: Any, clean: Any, control: Any | None, attackers: int, owners: int
) -> tuple[dict[str, Any], bool, list[str]]:
    """The JSON fields of an intruder run, whether the attacks had any effect on it (``main``), and
    the lines to print (one for the run, one for its control, and a warning when the control showed
    no effect: then this command cannot fail).

    Args:
        main: the attacked run, every defence on.
        clean: the same configuration without attackers (its failed rounds are the baseline).
        control: the attacked run with the defences off (``None``: not run).
        attackers: ranks running a Byzantine attack (left out of the honest peers).
        owners: ranks returning wrong aggregates (left out too).
    """
    from swarmtrain.simulation.intrusion import intrusion_summary

    out = intrusion_summary(main, clean, attackers, owners)
    effects = out["intruder_effects"]
    harmed = any(effects.values()) or bool(out["intruder_errors"])
    attempts = sum(out["intruder_attempts"].values()) + out["colluder_announcements"]
    lines = [
        f"{main.intruders} intruders, {main.colluders} colluders, {attempts:,} attempts, "
        f"{out['honest_downloads']} honest downloads; effects: {_effects_text(effects)}; "
        f"honest RSS growth {out['honest_rss_growth_mib']:.0f} MiB "
        f"(clean {out['clean_rss_growth_mib']:.0f} MiB)"
    ]
    if control is not None:
        ctl = intrusion_summary(control, clean, attackers, owners)
        shown = any(ctl["intruder_effects"].values())
        out.update(
            control=CONTROL,
            control_effects=ctl["intruder_effects"],
            control_shows_effect=shown,
            control_honest_downloads=ctl["honest_downloads"],
            control_colluder_states_served=ctl["colluder_states_served"],
            control_honest_identical=ctl["honest_identical"],
            control_errors=ctl["intruder_errors"],
            control_wall_s=control.wall_s,
        )
        lines.append(
            f"control ({CONTROL}): {ctl['honest_downloads']} honest downloads; "
            f"effects: {_effects_text(ctl['intruder_effects'])}"
        )
        if not shown:
            lines.append(
                "warning: the control showed no effect: the attacks did not act even without the "
                "defences, so the zero effects above prove nothing"
            )
    return out, harmed, lines
