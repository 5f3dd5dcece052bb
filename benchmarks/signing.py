"""What the signed DHT records cost: time to sign and to check one, and the bytes they add.

Every record the project reads from the DHT (peer, join, group, state announcement, suspicion) is
wrapped by ``peers.dht.dht_records.SignedRecords``: ``[value, writer's public key (DER), join token,
RSA signature]``, signed on store and checked (signature, key -> peer ID, admission) on every store
and read. This measures, with real libp2p RSA identity keys and a real run key:

* sign: ``sign_value`` of one record (what each write costs its writer);
* check, first sight: ``validate`` of a record from a writer not seen before (parses the key);
* check: ``validate`` again (keys are cached, the signature is checked every time);
* the bytes added to a record, under ``open`` (no token) and ``token`` (a join token inside);

for each policy, alternating ``--rounds`` times, and derives the cost of one round of an ``n``-peer
run from the records a peer writes and reads per round (``--records-per-round``). Prints a table and
writes ``benchmarks/results/signing.json``.

    python benchmarks/signing.py --rounds 5 --records 200
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from runlog import RESULTS, recorded, write_report  # noqa: E402

RUN = "signing-bench"


def _measure(policy: str, records: int, folder: Path) -> dict[str, float]:
    import msgpack
    from hivemind.dht.validation import DHTRecord

    from peers.dht.dht_records import SignedRecords
    from peers.keys.identity import ensure_identity
    from peers.keys.signing import Signer, _public_key
    from peers.trust.admission import Admission, RunKey

    writer_key = folder / f"writer-{policy}.key"
    ensure_identity(writer_key)
    writer = Signer(writer_key)
    reader_key = folder / f"reader-{policy}.key"
    ensure_identity(reader_key)
    reader = Signer(reader_key)
    token = None
    admission = Admission("open", RUN)
    if policy == "token":
        path = folder / f"run-{policy}.key"
        run_key = RunKey.load(path) if path.exists() else RunKey.generate(path)
        token = run_key.issue(RUN, writer.peer_id, time.time() + 3600)
        admission = Admission("token", RUN, frozenset(), bytes.fromhex(run_key.public_hex))
    w = SignedRecords(writer, admission, token)
    r = SignedRecords(reader, admission)
    value = bytes(msgpack.packb({"round": 12345, "members": ["x" * 46] * 4, "t": 1.0e9}))
    recs = [
        DHTRecord(f"k{i}".encode(), msgpack.packb(writer.peer_id), value, 1.0e9 + i) for i in range(records)
    ]
    t0 = time.perf_counter()
    signed = [dataclasses.replace(x, value=w.sign_value(x)) for x in recs]
    sign_s = (time.perf_counter() - t0) / records
    _public_key.cache_clear()
    t0 = time.perf_counter()
    assert r.validate(signed[0])  # first sight of the writer's key: parsed and hashed
    first_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    assert all(r.validate(x) for x in signed[1:])
    check_s = (time.perf_counter() - t0) / (records - 1)
    return {
        "sign_ms": sign_s * 1e3,
        "check_first_ms": first_s * 1e3,
        "check_ms": check_s * 1e3,
        "value_bytes": float(len(value)),
        "added_bytes": float(len(signed[0].value) - len(value)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--records", type=int, default=200)
    ap.add_argument("--peers", type=int, default=8, help="n of the per-round estimate")
    ap.add_argument(
        "--records-per-round",
        type=int,
        default=3,
        help="records each peer writes per round (join, group or its read, state announcement)",
    )
    ap.add_argument("--out", type=Path, default=RESULTS / "signing.json")
    args = ap.parse_args()
    runs: dict[str, list[dict[str, float]]] = {"open": [], "token": []}
    with tempfile.TemporaryDirectory(prefix="signing-bench-") as tmp:
        for _ in range(args.rounds):
            for policy in runs:
                runs[policy].append(_measure(policy, args.records, Path(tmp)))
    rows: list[dict[str, Any]] = []
    for policy, ms in runs.items():
        med = {k: statistics.median(m[k] for m in ms) for k in ms[0]}
        # per round a peer signs what it writes and checks what every peer wrote (reads and stores)
        writes = args.records_per_round
        checks = args.records_per_round * args.peers
        med["round_ms"] = writes * med["sign_ms"] + checks * med["check_ms"]
        med["round_bytes"] = checks * med["added_bytes"]
        rows.append({"policy": policy, **med})
    print(
        f"{'policy':<8}{'sign ms':>9}{'check ms':>10}{'1st chk ms':>12}{'+bytes':>8}"
        f"{'round ms':>10}{'round KiB':>11}"
    )
    for r in rows:
        print(
            f"{r['policy']:<8}{r['sign_ms']:>9.2f}{r['check_ms']:>10.3f}{r['check_first_ms']:>12.2f}"
            f"{r['added_bytes']:>8.0f}{r['round_ms']:>10.1f}{r['round_bytes'] / 1024:>11.1f}"
        )
    print(
        f"round: {args.records_per_round} records written per peer, {args.records_per_round * args.peers} "
        f"checked, {args.peers} peers (medians of {args.rounds} rounds of {args.records} records)"
    )
    result = {
        "benchmark": "signing",
        "recorded": recorded(),
        "records": args.records,
        "rounds": args.rounds,
        "peers": args.peers,
        "records_per_round": args.records_per_round,
        "policies": rows,
        "runs": runs,
    }
    write_report(args.out, result)


if __name__ == "__main__":
    main()
