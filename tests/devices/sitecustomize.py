"""Registers the emulated ``fakegpu`` device in every Python process started with this folder on
``PYTHONPATH`` (the device tests' peer processes): see ``fakegpu.py``."""

import fakegpu  # noqa: F401
