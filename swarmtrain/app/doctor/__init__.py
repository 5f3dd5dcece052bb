"""``swarmtrain doctor``: checks of this machine for a run (p2p daemon, reachability, links to the
run's peers, local training throughput, memory), a verdict and the role that suits it.

Each check is a function returning a :class:`~swarmtrain.app.doctor.result.Check`;
:mod:`~swarmtrain.app.doctor.verdict` turns them into a verdict and prints them.
"""
