"""SWARM parallelism (Ryabinin et al. 2023): stage servers, stochastic wiring, replicas stepping together.

* :mod:`peers.swarm.protocol`: the wire of stage requests (safe packets, bounded, validated).
* :mod:`peers.swarm.server`: :class:`StageServer`, one stage served with a bounded queue; its
  settings (:mod:`peers.swarm.server_config`), what it computes for a request and the rate it
  announces (:mod:`peers.swarm.stage_compute`), the step requests it holds (:mod:`peers.swarm.held_closes`).
* :mod:`peers.swarm.client`: :class:`SwarmPipeline`, a trainer's micro-batches through the stages;
  its requests on the wire (:mod:`peers.swarm.stage_call`).
* :mod:`peers.swarm.replicas`: :class:`ReplicaSync`, servers of one stage averaging gradients at
  each step (and parameters when a run ends).
* pure logic: :mod:`peers.swarm.steps` (when a server steps, on which gradient; duplicates),
  :mod:`peers.swarm.routing` (weighted random wiring), :mod:`peers.swarm.deadlines` (deadlines
  from measured service times), :mod:`peers.swarm.tracker` (exclusions, reroutes, micro-batches
  completed once).

Submodules are imported explicitly (``from peers.swarm.server import StageServer``) so the pure ones
stay importable without hivemind.
"""

from __future__ import annotations

__all__: list[str] = []
