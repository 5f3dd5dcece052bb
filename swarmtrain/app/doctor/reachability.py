"""Can other peers dial this machine? Asked through libp2p's AutoNAT and circuit relays in ``p2pd``.

A :class:`ReachabilityWatch` starts its own hivemind ``P2P`` (a ``p2pd``) listening on all
interfaces, with AutoNAT and auto-relay on, bootstrapped from the run's initial peers; it reads the
daemon's AutoNAT log lines (``GOLOG_LOG_LEVEL`` raised for the ``autonat`` subsystem only) and the
addresses the daemon announces. :func:`classify` turns what was seen into one answer, and says
``unknown`` whenever nothing proves otherwise: AutoNAT only answers after other peers dialled back
to a public address of ours, which takes a while and needs peers on public addresses.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import re
import threading
import time
from dataclasses import dataclass
from typing import Any

from swarmtrain.app.doctor.result import Check, Status

__all__ = ["ReachabilityWatch", "Seen", "classify", "is_public_maddr", "reachability_check"]

logger = logging.getLogger(__name__)
_P2PD_LOGGER = "hivemind.p2p.p2p_daemon"
# only the subsystems we read are raised to debug; the rest of the daemon stays quiet
_GOLOG_LEVEL = "error,autonat=debug,autorelay=debug"
_STATUS = re.compile(r"\b(public|private)\b", re.IGNORECASE)


def is_public_maddr(maddr: str) -> bool:
    """Whether a multiaddr names a globally routable IP (or a DNS name, which may be one)."""
    parts = [p for p in maddr.split("/") if p]
    for proto, value in zip(parts, parts[1:], strict=False):
        if proto in ("dns", "dns4", "dns6", "dnsaddr"):
            return value not in ("localhost",)
        if proto in ("ip4", "ip6"):
            try:
                return ipaddress.ip_address(value).is_global
            except ValueError:
                return False
    return False


@dataclass(frozen=True)
class Seen:
    """What a watch saw.

    Attributes:
        asked: peers were given to ask (initial peers).
        public_peers: at least one of them is on a public address (AutoNAT servers must be).
        autonat: the daemon's last AutoNAT status (``public``, ``private``) or ``None``.
        maddrs: the addresses the daemon announces for this machine.
        waited_s: how long the watch ran.
        error: why the daemon did not start, if it did not.
    """

    asked: bool
    public_peers: bool
    autonat: str | None
    maddrs: tuple[str, ...]
    waited_s: float
    error: str | None = None


def classify(seen: Seen) -> tuple[str, str]:
    """``(answer, why)``; answer is ``public``, ``behind NAT``, ``relayed`` or ``unknown``."""
    relayed = any("/p2p-circuit" in m for m in seen.maddrs)
    if seen.error:
        return "unknown", f"the daemon did not start: {seen.error}"
    if not seen.asked:
        return "unknown", "no peers to ask"
    if seen.autonat == "public":
        return "public", "AutoNAT: other peers dialled back"
    if relayed:
        return "relayed", "reachable only through a circuit relay"
    if seen.autonat == "private":
        return "behind NAT", "AutoNAT: dial-backs failed and no relay reservation"
    if not seen.public_peers:
        return "unknown", "no public peers to ask"
    own = [m for m in seen.maddrs if is_public_maddr(m)]
    hint = " (this machine has a public address)" if own else ""
    return "unknown", f"AutoNAT gave no answer in {seen.waited_s:.0f} s{hint}"


class _AutoNatLog(logging.Handler):
    """Keeps the last AutoNAT status the daemon logged."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.status: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        caller = str(getattr(record, "caller", ""))
        if "autonat" not in caller.lower():
            return
        msg = record.getMessage()
        if "status" not in msg.lower() and "reachab" not in msg.lower():
            return
        m = _STATUS.search(msg)
        if m:
            self.status = m.group(1).lower()


class ReachabilityWatch:
    """A p2pd on all interfaces with AutoNAT and auto-relay, watched until :meth:`result`.

    Args:
        initial_peers: the run's bootstrap multiaddrs.
        loop: a ``peers.wire.transport.LoopThread`` to run the daemon on.
    """

    def __init__(self, initial_peers: list[str], loop: Any) -> None:
        self.initial_peers = initial_peers
        self.loop = loop
        self.public_peers = any(is_public_maddr(m) for m in initial_peers)
        self._log = _AutoNatLog()
        self._p2p: Any = None
        self._error: str | None = None
        self._t0 = time.monotonic()
        self._lock = threading.Lock()
        self._target = logging.getLogger(_P2PD_LOGGER)
        self._saved = (self._target.level, self._target.propagate)

    def start(self, timeout: float) -> None:
        """Start the daemon (``timeout`` seconds at most); an error is kept for :meth:`result`."""
        from hivemind.p2p import P2P

        self._target.addHandler(self._log)
        self._target.setLevel(logging.DEBUG)
        self._target.propagate = False  # hivemind's own handler would print the debug lines
        saved_env = os.environ.get("GOLOG_LOG_LEVEL")
        os.environ["GOLOG_LOG_LEVEL"] = _GOLOG_LEVEL  # P2P.create copies the environment
        try:
            self._p2p = self.loop.run(
                P2P.create(
                    initial_peers=self.initial_peers,
                    host_maddrs=["/ip4/0.0.0.0/tcp/0"],
                    auto_nat=True,
                    use_relay=True,
                    use_auto_relay=True,
                    startup_timeout=timeout,
                ),
                timeout + 5.0,
            )
        except Exception as e:  # unreachable initial peers, a timeout
            self._error = f"{type(e).__name__}: {e}"[:160]
        finally:
            if saved_env is None:
                os.environ.pop("GOLOG_LOG_LEVEL", None)
            else:
                os.environ["GOLOG_LOG_LEVEL"] = saved_env
        self._t0 = time.monotonic()

    def _maddrs(self) -> tuple[str, ...]:
        if self._p2p is None:
            return ()
        try:
            return tuple(str(m) for m in self.loop.run(self._p2p.get_visible_maddrs(latest=True), 5.0))
        except Exception:
            logger.debug("reading the daemon's addresses failed", exc_info=True)
            return ()

    def result(self, wait: float, poll: float = 1.0) -> Seen:
        """Watch until AutoNAT answers, a relay address appears, or ``wait`` seconds after the start
        passed (no wait without public peers: nobody could answer); then stop the daemon."""
        deadline = self._t0 + (wait if self.public_peers else 0.0)
        maddrs = self._maddrs()
        while self._p2p is not None and time.monotonic() < deadline:
            if self._log.status == "public" or any("/p2p-circuit" in m for m in maddrs):
                break
            time.sleep(poll)
            maddrs = self._maddrs()
        seen = Seen(
            asked=bool(self.initial_peers),
            public_peers=self.public_peers,
            autonat=self._log.status,
            maddrs=maddrs,
            waited_s=time.monotonic() - self._t0,
            error=self._error,
        )
        self.close()
        return seen

    def close(self) -> None:
        """Stop the daemon and stop reading its log."""
        with self._lock:
            p2p, self._p2p = self._p2p, None
        if p2p is not None:
            try:
                self.loop.run(p2p.shutdown(), 5.0)
            except Exception:
                logger.debug("stopping the reachability daemon failed", exc_info=True)
        self._target.removeHandler(self._log)
        self._target.setLevel(self._saved[0])
        self._target.propagate = self._saved[1]


def reachability_check(seen: Seen) -> Check:
    """The ``reachability`` check of what a watch saw."""
    answer, why = classify(seen)
    status: Status = "ok" if answer == "public" else "warn"
    data: dict[str, float | int | str | None] = {
        "answer": answer,
        "autonat": seen.autonat,
        "relayed": int(answer == "relayed"),
        "watched_s": seen.waited_s,
        "addresses": ",".join(seen.maddrs)[:400],
    }
    return Check("reachability", status, answer, why, data)
