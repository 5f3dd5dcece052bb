"""The fork server's preload (``peers.dht.preload``): what every peer process shares with it."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

from peers.dht.process import process_context

CHECK = """
import gc, sys, threading
import peers.dht.preload
import torch
assert gc.get_freeze_count() > 0, "nothing frozen"
assert "torch._dynamo" in sys.modules
assert "hivemind" not in sys.modules, "hivemind makes process-shared locks at import"
assert threading.active_count() == 1, threading.enumerate()
assert not torch.cuda.is_initialized()
print("ok")
"""


def test_the_preload_imports_torch_and_dynamo_frozen_without_threads_locks_or_cuda() -> None:
    proc = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


def _report(q: Any) -> None:
    import gc

    q.put((gc.get_freeze_count(), "torch._dynamo" in sys.modules))


def test_a_forked_peer_process_inherits_the_frozen_preload() -> None:
    ctx = process_context()
    q = ctx.Queue()
    p = ctx.Process(target=_report, args=(q,))
    p.start()
    try:
        frozen, dynamo = q.get(timeout=120)
    finally:
        p.join(30)
    assert frozen > 1000 and dynamo
