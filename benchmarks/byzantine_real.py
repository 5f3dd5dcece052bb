"""The real-peer rows of the Byzantine benchmark: ``swarmtrain simulate`` per row, merged into
``benchmarks/results/byzantine_real.json`` (see ``benchmarks/byzantine.py --real-peers``)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from runlog import write_json

REAL_ATTACKS = [
    "sign_flip",
    "random_direction",
    "gaussian_noise",
    "label_flip",
    "alie",
    "ipm",
    "stale",
    "malicious_owner",
]
# (attack, reducer, owner_check): the clean run, the undefended mean under sign flip and one row per
# attack a lone attacker can run with the defence (3 peers, 1 attacker) ...
REAL_CELLS_1 = [("none", "mean", False), ("sign_flip", "mean", False)] + [
    (a, "centered_clip", False) for a in ("sign_flip", "random_direction", "gaussian_noise", "stale")
]
# ... label flip with and without the defence, and the malicious owner: the clean run with the owner
# check (its byte cost), the owner without and with the check (a reducer cannot help: it runs on the
# owner) ...
REAL_CELLS_1_NEW = [
    ("none", "mean", False),
    ("label_flip", "mean", False),
    ("label_flip", "centered_clip", False),
    ("none", "mean", True),
    ("malicious_owner", "mean", False),
    ("malicious_owner", "mean", True),
]
# ... and the colluding attacks with 2 of 5 (one attacker alone has no spread to estimate for ALIE).
REAL_CELLS_2 = [("none", "mean", False)] + [
    (a, r, False) for a in ("alie", "ipm") for r in ("mean", "centered_clip")
]


def _real_row(attack: str, reducer: str, owner_check: bool, n: int, k: int, steps: int) -> dict[str, Any]:
    """One ``swarmtrain simulate`` run (its own subprocess) as a result row."""
    import subprocess
    import tempfile

    f = k if attack != "none" else 0
    with tempfile.TemporaryDirectory() as tmp:
        js = Path(tmp) / "run.json"
        cmd = ["swarmtrain", "simulate", "-n", str(n), "--steps", str(steps), "-H", "10"]
        cmd += ["--compressor", "none", "--reducer", reducer, "--json", str(js)]
        if reducer != "mean":
            cmd += ["--tolerate", str(k)]
        if attack != "none":
            cmd += ["--byzantine", str(k), "--attack", attack]
        if owner_check:
            cmd += ["--owner-check"]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
        res = json.loads(js.read_text()) if js.exists() else {}
    return {
        "attack": attack,
        "reducer": reducer,
        "owner_check": owner_check,
        "n": n,
        "f": f,
        "steps": steps,
        "loss": res.get("final_val_loss"),
        "params_identical": res.get("params_identical"),
        "bytes_sent_per_peer": res.get("bytes_sent_per_peer"),
        "wall_s": res.get("wall_s"),
        "run_s": round(time.perf_counter() - t0, 1),
        "rc": proc.returncode,
        "error": proc.stderr.strip().splitlines()[-1] if proc.returncode and proc.stderr.strip() else "",
    }


def _row_key(r: dict[str, Any]) -> tuple[Any, ...]:
    return (r["n"], r["f"], r["attack"], r["reducer"], bool(r.get("owner_check", False)), r["steps"])


def _real_ratios(rows: list[dict[str, Any]]) -> None:
    """Each row's loss / the clean (no attacker, mean, no owner check) loss of the same n and steps;
    the owner check's byte cost as bytes with / without it on clean runs of the same n."""
    clean = {
        (r["n"], r["steps"]): r
        for r in rows
        if r["attack"] == "none" and r["reducer"] == "mean" and not r.get("owner_check")
    }
    for r in rows:
        base = clean.get((r["n"], r["steps"]))
        base_loss = base["loss"] if base is not None else None
        r["clean_loss"] = base_loss
        r["ratio"] = r["loss"] / base_loss if base_loss and r["loss"] is not None else None
        base_sent = base["bytes_sent_per_peer"] if base is not None else None
        if r["attack"] == "none" and r.get("owner_check") and r.get("bytes_sent_per_peer") and base_sent:
            r["bytes_vs_no_check"] = r["bytes_sent_per_peer"] / base_sent


def _real_table(rows: list[dict[str, Any]]) -> str:
    lines = []
    for n, f in sorted({(r["n"], r["f"]) for r in rows if r["f"]}):
        sel = [r for r in rows if r["n"] == n and (r["f"] in (0, f))]
        clean = next((r["loss"] for r in sel if r["attack"] == "none" and r["reducer"] == "mean"), None)
        lines.append(
            f"\nreal peers ({n} peers, {f} attacking, DiLoCo H=10): loss / clean-mean loss ({clean})"
        )
        cols = [("mean", False), ("centered_clip", False), ("mean", True)]
        lines.append(f"{'attack':<18}{'mean':>10}{'centered_clip':>15}{'mean+owner check':>18}")
        for attack in ["none", *REAL_ATTACKS]:
            got = {
                (r["reducer"], bool(r.get("owner_check"))): r["ratio"] for r in sel if r["attack"] == attack
            }
            if not got:
                continue
            cells = [f"{got[c]:.2f}" if got.get(c) is not None else "-" for c in cols]
            lines.append(f"{attack:<18}{cells[0]:>10}{cells[1]:>15}{cells[2]:>18}")
    return "\n".join(lines)


def real_peers(out: Path, steps: int, groups: list[str]) -> int:
    """Real-peer rows through ``swarmtrain simulate``, merged into ``byzantine_real.json``.

    ``groups``: ``one`` (3 peers, 1 attacker: the original rows), ``one-new`` (3 peers, 1 attacker:
    label flip and the malicious owner), ``two`` (5 peers, 2 colluding attackers: ALIE, IPM). A row
    replaces a stored row with the same (n, f, attack, reducer, owner check, steps).
    """
    path = out / "byzantine_real.json"
    saved = json.loads(path.read_text()) if path.exists() else {}
    rows: list[dict[str, Any]] = list(saved.get("rows", []))
    plan = {"one": (3, 1, REAL_CELLS_1), "one-new": (3, 1, REAL_CELLS_1_NEW), "two": (5, 2, REAL_CELLS_2)}
    t0 = time.perf_counter()
    for g in groups:
        n, k, cells = plan[g]
        for attack, reducer, check in cells:
            row = _real_row(attack, reducer, check, n, k, steps)
            rows = [r for r in rows if _row_key(r) != _row_key(row)] + [row]
            print(
                f"  real n={n} {attack:<16} {reducer:<14} check={check!s:<5} loss={row['loss']} "
                f"identical={row['params_identical']} rc={row['rc']} ({row['run_s']} s) {row['error']}",
                flush=True,
            )
            out.mkdir(parents=True, exist_ok=True)  # partial results survive an interrupted run
            write_json(path, {**saved, "rows": rows, "partial": True}, indent=1)
    _real_ratios(rows)
    print(_real_table(rows))
    meta = dict(saved.get("meta", {}))
    meta.update(
        {
            "benchmark": "byzantine_real",
            "command": "swarmtrain simulate -H 10 --compressor none (one subprocess per row)",
            "strategy": "diloco",
            "preset": "tiny",
            "inner_steps": 10,
            "steps": steps,
            "groups": {
                "3 peers, 1 attacker": "sign flip, random direction, noise, stale, label flip, "
                "malicious owner",
                "5 peers, 2 colluding attackers": "ALIE, IPM (estimated from the colluders' own updates)",
            },
            "cpu_count": os.cpu_count(),
        }
    )
    meta.pop("peers", None)
    meta.pop("attackers", None)
    if "seconds" in meta:  # the first run (group "one") stored its time under this key
        meta["seconds_one"] = meta.pop("seconds")
    check = [r for r in rows if r.get("bytes_vs_no_check")]
    if check:
        meta["owner_check_bytes_ratio"] = check[-1]["bytes_vs_no_check"]
    meta[f"seconds_{'+'.join(groups)}"] = round(time.perf_counter() - t0, 1)
    write_json(path, {"meta": meta, "rows": rows}, indent=1)
    path.with_suffix(".txt").write_text(_real_table(rows).lstrip() + "\n")
    print(f"wrote {path}")
    print(f"wrote {path.with_suffix('.txt')}")
    return 0
