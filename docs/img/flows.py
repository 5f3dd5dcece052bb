"""Two pictures of ``docs/architecture.md``: one DiLoCo round and one SWARM step."""

from __future__ import annotations

from drawing import COLORS, arrow, bottom, box, canvas, left, legend, right, save, top  # type: ignore[import-not-found]


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
