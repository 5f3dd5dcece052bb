"""The core: interfaces, errors, config types, registries, packets and the safe wire codec.

It imports nothing of the app, the library packages or the simulation; everything else may import it.
"""

__version__ = "0.1.0"
