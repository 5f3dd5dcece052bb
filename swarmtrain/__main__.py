"""``python -m swarmtrain``: the same command line as the ``swarmtrain`` entry point."""

from __future__ import annotations

from swarmtrain.app.cli import main

__all__: list[str] = []

if __name__ == "__main__":
    main()
