"""One training peer of a run: the peer loop shared by ``join`` and ``simulate``, its shareable
state, saved state, run agreement and manifest, preemption hand-off, the live line."""
