"""CLI sub-commands. Each module exposes ``register(app)``; ``swarmtrain.app.cli`` lists them.

Modules import heavy dependencies (torch, hivemind) inside the command bodies so ``--help`` is fast.
"""
