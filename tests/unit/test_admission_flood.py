"""A stranger's flood of streams costs one admission check at a time (``AdmittedPeers.acheck``): its
streams share the check in flight instead of each holding a worker thread of the node's executor,
and an admitted peer whose record shows up after a check began is still admitted by the next one."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

from peers.trust.admission import Admission, RunKey
from peers.trust.admitted import AdmittedPeers, token_fields

RUN = "t-flood"


def _policy(tmp_path: Path) -> tuple[Admission, RunKey]:
    key = RunKey.generate(tmp_path / "run.key")
    return Admission("token", RUN, run_public=bytes.fromhex(key.public_hex)), key


class SlowRecords:
    """A DHT read that takes ``delay`` seconds and counts the worker threads inside it at once."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.records: list[object] = []
        self.inside = self.most = self.reads = 0
        self.lock = threading.Lock()

    def __call__(self) -> list[object]:
        with self.lock:
            self.inside += 1
            self.reads += 1
            self.most = max(self.most, self.inside)
            found = list(self.records)  # what the DHT held when the read began
        time.sleep(self.delay)
        with self.lock:
            self.inside -= 1
        return found


def test_a_strangers_streams_share_one_check(tmp_path: Path) -> None:
    policy, _ = _policy(tmp_path)
    records = SlowRecords(0.2)
    peers = AdmittedPeers(policy, records, min_interval=0.05)
    busy: list[int] = []

    async def flood() -> list[bool]:
        loop = asyncio.get_running_loop()
        # the executor the node's other work would wait on: its thread count is what a flood takes
        count = threading.active_count()
        task = asyncio.gather(*(peers.acheck("stranger") for _ in range(200)))
        await asyncio.sleep(0.1)
        busy.append(threading.active_count() - count)
        out = await task
        assert loop.is_running()
        return list(out)

    answers = asyncio.run(flood())
    assert answers == [False] * 200  # every stream refused
    assert records.most == 1  # one read at a time, whatever the number of streams
    assert records.reads <= 3  # the first check, and at most one more for streams asked during it
    assert busy[0] <= 2, busy  # (a thread of the executor, and none per stream)


def test_an_admitted_peer_seen_after_a_check_began_is_admitted(tmp_path: Path) -> None:
    policy, key = _policy(tmp_path)
    records = SlowRecords(0.3)
    peers = AdmittedPeers(policy, records, min_interval=0.0)

    class Rec:
        peer_id = "late"
        extra = dict(token_fields(key.issue(RUN, "late", time.time() + 3600)))

    async def two_streams() -> tuple[bool, bool]:
        first = asyncio.ensure_future(peers.acheck("late"))
        await asyncio.sleep(0.1)  # its record shows up while the first check reads
        records.records.append(Rec())
        second = await peers.acheck("late")
        return await first, second

    first, second = asyncio.run(two_streams())
    assert first is False  # the read that began before its record existed
    assert second is True  # asked after: answered by a read that began after it
