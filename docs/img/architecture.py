"""Draw the pictures of ``docs/architecture.md``: the layers, one DiLoCo round, one SWARM step.

Run: ``python docs/img/architecture.py`` (matplotlib); it rewrites ``architecture.png``,
``diloco_round.png`` and ``swarm_step.png`` beside this file. The boxes name real packages, modules
and functions; when one moves, change it here and run the script again.
"""

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


def diloco_round() -> None:
    """``diloco_round.png``: one DiLoCo round, from the inner steps to the outer step (a snake of nine)."""
    fig, ax = canvas(17.4, 10.6, "One DiLoCo round (one peer's view; every member runs the same steps)")
    w, h, gap = 5.0, 2.0, 1.0
    xs = [0.3, 0.3 + w + gap, 0.3 + 2 * (w + gap)]
    ys = [7.4, 4.5, 1.6]
    steps = [
        (
            "1. inner steps (H of them)",
            "Trainer.step (app/train/trainer.py)\n-> DiLoCo.step (optimizers/diloco.py):\n"
            "inner optimizer step; every H-th\nstep calls DiLoCo._sync",
            "optimizers",
        ),
        (
            "2. pseudo-gradient",
            "delta = anchor - local, fp32, on the\nmodel's device (OuterStore);\n"
            "reduce_or_rollback opens the codec's\ntransaction -> P2PCollective.all_reduce",
            "optimizers",
        ),
        (
            "3. round formation over the DHT",
            "Matchmaker.form_group (rounds/rounds.py):\njoin records + pushed joins; the smallest\n"
            "joiner leads, publishes and pushes the\nmember list -> Group, digest, budgets",
            "peers",
        ),
        (
            "4. butterfly: parts out",
            "ButterflyRound (rounds/butterfly.py): flat\nvector -> one partition per member ->\n"
            "chunks; codec (staging.compress_many)\n-> one channel per owner (wire/channels.py)",
            "peers",
        ),
        (
            "5. receive: budgets before bytes",
            "stream handler (rounds/inbound.py):\nadmission, stream caps, Mailbox.reserve\n"
            "(wire/mailbox.py), MessageClock,\nByteLedger.add_received, ack",
            "wire",
        ),
        (
            "6. owner: reduce where the input lives",
            "decode_chunk (RoundIO) -> rows moved\nonce to the input's device -> Reducer\n"
            "(peers/reducers; mean in place) ->\naggregate encoded once, sent to all",
            "reducers",
        ),
        (
            "7. everyone decodes the same bytes",
            "take_aggregate / reduce_chunk write\ninto one result buffer (own decode\n"
            "of its own aggregate too); optional\nowner check (rounds/owner_check.py)",
            "peers",
        ),
        (
            "8. commit agreement",
            "agree (rounds/agreement.py): 'have' to\nevery member; commit only with every\n"
            "member's 'have' -> RoundResult;\nfailure kinds: rounds/round_errors.py",
            "peers",
        ),
        (
            "9. outer step, or nothing",
            "committed: OuterStore.step -> OuterSGD\n(Nesterov), local <- anchor; commit_round\n"
            "failed: parameters untouched, abort_round;\nthe next sync covers every step since",
            "optimizers",
        ),
    ]
    order = [(0, 0), (1, 0), (2, 0), (2, 1), (1, 1), (0, 1), (0, 2), (1, 2), (2, 2)]
    boxes = []
    for (title, body, key), (c, r) in zip(steps, order, strict=True):
        boxes.append(box(ax, xs[c], ys[r], w, h, title, body, COLORS[key], size=8.6))
    labels = ["", "tensors", "Group", "parts", "", "aggregates", "result", ""]
    for i in range(8):
        a, b = boxes[i], boxes[i + 1]
        (ca, ra), (cb, rb) = order[i], order[i + 1]
        if ra == rb:
            pa, pb = (right(a), left(b)) if cb > ca else (left(a), right(b))
        else:
            pa, pb = bottom(a), top(b)
        arrow(ax, pa, pb, labels[i], size=7.5, offset=(0.0, 0.25) if ra == rb else (0.0, 0.0))
    ax.text(
        8.7,
        1.15,
        "Every message carries the round's group digest and tensor layout; bytes are counted in the "
        "ByteLedger where they hit the stream.\n"
        "A missing, refused or late message, a member's abort or the deadline fails the round for this "
        "peer, which tells the others to abort.",
        ha="center",
        va="top",
        fontsize=8.5,
    )
    legend(
        ax,
        3.2,
        0.15,
        [
            ("optimizers", "optimizers"),
            ("peers.rounds", "peers"),
            ("peers.wire", "wire"),
            ("peers.reducers", "reducers"),
        ],
    )
    save(fig, "diloco_round.png")


def swarm_step() -> None:
    """``swarm_step.png``: one SWARM optimizer step, micro-batches through the stages, then the close."""
    fig, ax = canvas(17.0, 13.6, "One SWARM step (trainer t of T, stages 0..S-1, replicas of each stage)")
    cols = [
        (
            0.4,
            "trainer t",
            "SwarmPipeline\n(peers/swarm/client.py)\nrun_trainer (app/swarm/roles.py)",
            COLORS["app"],
        ),
        (
            4.6,
            "stage 0 servers",
            "StageServer (peers/swarm/server.py)\nrun_server (app/swarm/server.py)",
            COLORS["peers"],
        ),
        (
            8.8,
            "stage 1 .. S-2",
            "the same; one replica per stage\npicked per request (routing.py)",
            COLORS["peers"],
        ),
        (13.0, "last stage S-1", "forward, loss and backward\nin one request", COLORS["peers"]),
    ]
    for x, title, body, color in cols:
        box(ax, x, 11.6, 3.6, 1.4, title, body, color, size=8.3)
        ax.plot([x + 1.8, x + 1.8], [2.7, 11.6], color="#bbbbbb", linewidth=1.0, linestyle=":")
    cx = [x + 1.8 for x, *_ in cols]
    y = 11.2
    ax.text(0.2, y, "for each micro-batch m of the step (train_microbatch):", fontsize=9.5, weight="bold")
    y -= 0.55
    flow = [
        (0, 1, "sw_fwd [tokens]", 0.5),
        (1, 0, "hidden (codec bytes)", 0.5),
        (0, 2, "sw_fwd [hidden], the bytes forwarded unchanged", 0.62),
        (2, 0, "hidden", 0.62),
        (0, 3, "sw_fwd [hidden, targets]", 0.7),
        (3, 0, "loss (in the note) + gradient of its input; its parameter gradients accumulate", 0.55),
        (0, 2, "sw_bwd [input, grad_output] to the server that ran the forward", 0.55),
        (2, 0, "gradient of its input (forward recomputed)", 0.6),
        (0, 1, "sw_bwd [tokens, grad_output]", 0.5),
        (1, 0, "answer without frames", 0.5),
    ]
    for a, b, label, at in flow:
        arrow(ax, (cx[a], y), (cx[b], y), label, size=8, label_at=at)
        y -= 0.5
    for c in cx[1:]:
        ax.text(
            c,
            y + 0.05,
            "StageSteps.backward_done:\n.grad += (once per m)",
            fontsize=7.5,
            ha="center",
            va="top",
            color="#223366",
        )
    y -= 1.0
    ax.text(
        0.2, y, "after `accumulate` micro-batches: close the step (close_step)", fontsize=9.5, weight="bold"
    )
    y -= 0.55
    arrow(
        ax,
        (cx[0], y),
        (cx[3], y),
        "holds? to each server that took m's gradients; a micro-batch whose gradients are gone is fed again",
        size=8,
        label_at=0.55,
    )
    y -= 0.55
    arrow(
        ax,
        (cx[0], y),
        (cx[3], y),
        "step request (servers of the stage it sees, micro-batches completed) to every server of every stage",
        size=8,
        label_at=0.55,
    )
    rbox = box(
        ax,
        4.4,
        0.6,
        12.4,
        2.1,
        "when all T trainers closed it, on every server: StageSteps.take",
        "ReplicaSync.sum_grads (peers/swarm/replicas.py): the stage's replicas join one round of the\n"
        "run's P2PCollective (namespace <run>.stage<k>, kind 'stage'): the same matchmaking, butterfly,\n"
        "mailbox, ledger and commit agreement as a DiLoCo round; mean x members = the gradient sum\n"
        "(and the micro-batch count); divided by the micro-batches completed, every replica takes the\n"
        "same optimizer step -> identical parameters. A count short of the trainers': no step, close again",
        COLORS["peers"],
        size=8.3,
    )
    arrow(ax, left(rbox, 0.4), (cx[0], 0.6 + 2.1 * 0.4), "answer: the new version", size=8)
    ax.plot([cx[0], cx[0]], [1.44, 2.7], color="#bbbbbb", linewidth=1.0, linestyle=":")
    save(fig, "swarm_step.png")


def main() -> None:
    layers()
    diloco_round()
    swarm_step()


if __name__ == "__main__":
    main()
