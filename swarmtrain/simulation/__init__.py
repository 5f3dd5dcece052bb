"""Simulation only: the multi-peer runner behind ``swarmtrain simulate`` and the attacks it installs.

Nothing in the library (``compression``, ``optimizers``, ``peers``) or the core imports it; a unit
test checks that from the source.
"""
