"""The app: the local training loop, checkpoints, models, data, the peer loop and the CLI.

It may import the core and the library packages; it reaches the simulation package only from the
``simulate`` command, lazily.
"""
