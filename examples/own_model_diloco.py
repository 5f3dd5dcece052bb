"""Your own torch.nn.Module trained with DiLoCo by 2 peer processes on 127.0.0.1 (int8 syncs).

Run: ``python examples/own_model_diloco.py [--steps 100] [--inner-steps 10]``. Peer 0 starts a run, peer 1
joins it through the DHT; each sync prints both peers' mean loss and a digest of their shared parameters.
"""

import argparse
import sys

import torch

import swarmtrain


def train(rank: int, initial_peers: list[str], steps: int, inner_steps: int) -> int:
    sys.stdout.reconfigure(line_buffering=True)  # both peers print live
    torch.manual_seed(0)  # every peer must start from the same parameters
    model = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    data, w, losses = torch.Generator().manual_seed(1 + rank), torch.linspace(-0.5, 0.5, 8), []
    with swarmtrain.connect(
        model, opt, run_id="own-model", initial_peers=initial_peers, host="127.0.0.1", min_peers=2,
        expected_peers=2, inner_steps=inner_steps, compression="int8",
    ) as peer:  # fmt: skip
        child = swarmtrain.spawn_function(train, (1, peer.maddrs, steps, inner_steps)) if rank == 0 else None
        for step in range(1, steps + 1):
            x = torch.randn(64, 8, generator=data)  # each peer draws its own data
            loss = torch.nn.functional.mse_loss(model(x).squeeze(1), torch.sin(x @ w))
            opt.zero_grad()
            loss.backward()
            losses.append(loss.item())
            report = peer.step(tokens=len(x))  # replaces opt.step(); every H steps it also syncs
            if report.synced:
                done = f"committed by {report.participants} peers" if report.committed else "FAILED"
                head = f"peer {rank} step {step} loss {sum(losses[-inner_steps:]) / inner_steps:.4f}"
                # one write per line: both peers share this stdout (unbuffered under PYTHONUNBUFFERED)
                sys.stdout.write(f"{head} sync {done} params {peer.digest()[:16]}\n")
        return 0 if child is None or (child.join(300) and child.exitcode == 0) else 1


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="DiLoCo on your own model, 2 peers", usage=argparse.SUPPRESS)
    ap.add_argument("--steps", type=int, default=100, help="local steps per peer")
    ap.add_argument("--inner-steps", type=int, default=10, help="H: local steps between syncs")
    args = ap.parse_args()
    if min(args.steps, args.inner_steps) < 1:
        ap.error("--steps and --inner-steps must be positive integers")
    sys.exit(train(0, [], args.steps, args.inner_steps))
