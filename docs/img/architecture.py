"""Draw the pictures of ``docs/architecture.md``: the layers, one DiLoCo round, one SWARM step.

Run: ``python docs/img/architecture.py`` (matplotlib); it rewrites ``architecture.png``,
``diloco_round.png`` and ``swarm_step.png`` beside this file. The boxes name real packages, modules
and functions; when one moves, change it here and run the script again.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # drawing.py and flows.py beside it

from drawing import COLORS, arrow, bottom, box, canvas, left, right, save, top  # type: ignore[import-not-found]  # noqa: E402
from flows import diloco_round, swarm_step  # type: ignore[import-not-found]  # noqa: E402


def layers() -> None:
    """``architecture.png``: the packages and what each may import (arrows point at what is imported)."""
    fig, ax = canvas(
        21.0, 11.5, "swarmtrain: packages and import direction (an arrow points at what may be imported)"
    )

    # --- left: the whole project -------------------------------------------------------------------
    ax.text(4.9, 10.7, "the project", ha="center", fontsize=12, weight="bold")
    outside = box(
        ax,
        0.6,
        9.0,
        8.6,
        1.3,
        "examples/   benchmarks/   tests/",
        "public API (swarmtrain re-exports it lazily); tests: unit/, integration/ (real peers on\n"
        "127.0.0.1), wan/ (emulated regions), devices/fakegpu.py (an emulated accelerator)",
        COLORS["outside"],
        size=8.5,
    )
    app = box(
        ax,
        0.6,
        6.9,
        5.4,
        1.6,
        "swarmtrain.app",
        "cli.py + commands/ (join, simulate, bench, ...)\npeer/ (the peer loop), swarm/ (SWARM roles),\n"
        "train/ (Trainer), models/, data/, doctor/, dashboard/",
        COLORS["app"],
        size=8.5,
    )
    sim = box(
        ax,
        6.6,
        6.9,
        2.6,
        1.6,
        "simulation",
        "swarmtrain.simulation: chaos,\nattacks, regions; imported\n"
        "only by commands.simulate,\nsimulate_swarm and bench",
        COLORS["simulation"],
        size=7.8,
        dashed=True,
    )
    opt = box(
        ax,
        0.6,
        4.6,
        3.6,
        1.7,
        "optimizers",
        "strategies: what to send,\nwhen, what to do with it\n"
        "(DiLoCo, Streaming DiLoCo,\nDeMo, DataParallel)",
        COLORS["optimizers"],
        size=8.5,
    )
    peers = box(
        ax,
        4.8,
        4.6,
        4.4,
        1.7,
        "peers",
        "everything that crosses the network:\nDHT, rounds, butterfly all-reduce,\n"
        "reducers, trust, state transfer, SWARM",
        COLORS["peers"],
        size=8.5,
    )
    comp = box(
        ax,
        0.6,
        2.5,
        8.6,
        1.3,
        "compression",
        "tensor codecs: pure math, no network (none, fp16, bf16, int8, int4, ternary, topk, EF)",
        COLORS["compression"],
        size=8.5,
    )
    core = box(
        ax,
        0.6,
        0.4,
        8.6,
        1.4,
        "swarmtrain.core",
        "protocols (Compressor, Reducer, Collective, Strategy), errors, config,\n"
        "registries, Packet + safe wire format, bounded msgpack: imports only third-party",
        COLORS["core"],
        size=8.5,
    )
    arrow(ax, bottom(outside, 0.35), top(app, 0.55))
    arrow(ax, bottom(app, 0.25), top(opt, 0.5))
    arrow(ax, bottom(app, 0.8), top(peers, 0.3))
    arrow(ax, right(app, 0.5), left(sim, 0.5), dashed=True, color="#777777")
    arrow(ax, bottom(opt, 0.5), top(comp, 0.2))
    arrow(ax, bottom(peers, 0.5), top(comp, 0.75))
    arrow(ax, bottom(comp, 0.5), top(core, 0.5))
    arrow(ax, left(opt, 0.3), left(core, 0.6), color="#777777", rad=0.25)
    arrow(ax, right(peers, 0.3), right(core, 0.6), color="#777777", rad=-0.25)
    ax.text(
        4.9,
        4.35,
        "optimizers talks to peers only through the Collective protocol (swarmtrain.core)",
        ha="center",
        fontsize=8.5,
        style="italic",
    )

    # --- middle: peers/ by concern -----------------------------------------------------------------
    dx = 1.0
    ax.text(12.0 + dx, 10.7, "peers/ by concern (PEERS_LAYERS)", ha="center", fontsize=12, weight="bold")
    sw = box(
        ax,
        10.2 + dx,
        9.0,
        3.6,
        1.1,
        "peers.swarm",
        "stage servers, pipeline,\nreplicas step together",
        COLORS["peers"],
        size=8,
    )
    rounds = box(
        ax,
        9.6 + dx,
        7.0,
        2.6,
        1.3,
        "peers.rounds",
        "matchmaking, butterfly,\nagreement, guard",
        COLORS["peers"],
        size=8,
    )
    state = box(
        ax, 12.5 + dx, 7.0, 2.4, 1.3, "peers.state", "state download\nin chunks", COLORS["peers"], size=8
    )
    dht = box(
        ax,
        11.8 + dx,
        5.1,
        2.6,
        1.2,
        "peers.dht",
        "node, records,\nprocesses, probes",
        COLORS["peers"],
        size=8,
    )
    trust = box(
        ax,
        10.0 + dx,
        3.3,
        2.4,
        1.2,
        "peers.trust",
        "admission, manifest,\nsuspicion",
        COLORS["peers"],
        size=8,
    )
    keys = box(ax, 10.0 + dx, 1.4, 2.4, 1.1, "peers.keys", "identity, signing", COLORS["peers"], size=8)
    wire = box(
        ax,
        12.8 + dx,
        1.4,
        2.2,
        2.0,
        "peers.wire",
        "transport, channels,\nmessages, mailbox,\nledger, memory",
        COLORS["wire"],
        size=8,
    )
    red = box(ax, 9.2 + dx, 5.1, 1.9, 1.2, "peers.reducers", "pure rules", COLORS["reducers"], size=8)
    arrow(ax, bottom(sw, 0.25), top(rounds, 0.5))
    arrow(ax, bottom(sw, 0.75), top(state, 0.5))
    arrow(ax, bottom(rounds, 0.75), top(dht, 0.3))
    arrow(ax, bottom(rounds, 0.2), top(red, 0.5))
    arrow(ax, bottom(state, 0.5), top(dht, 0.75))
    arrow(ax, bottom(dht, 0.2), top(trust, 0.7))
    arrow(ax, bottom(dht, 0.8), top(wire, 0.5))
    arrow(ax, bottom(trust, 0.5), top(keys, 0.5))
    ax.text(
        12.2 + dx,
        0.55,
        "a layer may also import what the layers it points at import\n"
        "(rounds: keys, wire, trust, dht, reducers; swarm: all but reducers)",
        ha="center",
        fontsize=8,
        style="italic",
    )

    # --- right: swarmtrain/app/ by concern ---------------------------------------------------------
    ax.text(18.4, 10.7, "swarmtrain/app/ by concern (APP_LAYERS)", ha="center", fontsize=12, weight="bold")
    cmd = box(ax, 16.6, 9.0, 3.6, 1.1, "cli.py, commands/", "may import every unit", COLORS["app"], size=8)
    aswarm = box(ax, 16.0, 7.3, 1.3, 0.9, "swarm", "", COLORS["app"], size=8)
    bench = box(ax, 17.5, 7.3, 1.3, 0.9, "bench", "", COLORS["app"], size=8)
    doctor = box(ax, 19.0, 7.3, 1.3, 0.9, "doctor", "", COLORS["app"], size=8)
    apeer = box(ax, 16.0, 5.6, 1.3, 0.9, "peer", "", COLORS["app"], size=8)
    local = box(ax, 17.6, 5.6, 1.5, 0.9, "local_run", "", COLORS["app"], size=8)
    dash = box(ax, 19.4, 5.6, 1.5, 0.9, "dashboard", "", COLORS["app"], size=8)
    train = box(ax, 16.9, 3.9, 1.4, 0.9, "train", "", COLORS["app"], size=8)
    models = box(ax, 16.0, 2.2, 1.4, 0.9, "models", "", COLORS["app"], size=8)
    data = box(ax, 17.8, 2.2, 1.3, 0.9, "data", "", COLORS["app"], size=8)
    logs = box(ax, 16.3, 0.6, 1.2, 0.8, "logs", "", COLORS["app"], size=8)
    units = box(ax, 18.6, 0.6, 1.3, 0.8, "units", "", COLORS["app"], size=8)
    arrow(ax, bottom(cmd, 0.1), top(aswarm, 0.5))
    arrow(ax, bottom(cmd, 0.5), top(bench, 0.5))
    arrow(ax, bottom(cmd, 0.9), top(doctor, 0.5))
    arrow(ax, bottom(aswarm, 0.5), top(apeer, 0.5))
    arrow(ax, bottom(bench, 0.2), top(apeer, 0.8))
    arrow(ax, bottom(bench, 0.6), top(local, 0.5))
    arrow(ax, bottom(apeer, 0.6), top(train, 0.3))
    arrow(ax, bottom(doctor, 0.3), top(train, 0.9))
    arrow(ax, bottom(train, 0.2), top(models, 0.6))
    arrow(ax, bottom(train, 0.8), top(data, 0.4))
    arrow(ax, bottom(data, 0.6), top(units, 0.3))
    arrow(ax, bottom(dash, 0.5), top(units, 0.8), color="#777777")
    _ = logs
    ax.text(
        18.4,
        0.05,
        "the exact lists: docs/architecture.md, Import rules",
        ha="center",
        fontsize=8,
        style="italic",
    )
    save(fig, "architecture.png")


def main() -> None:
    layers()
    diloco_round()
    swarm_step()


if __name__ == "__main__":
    main()
