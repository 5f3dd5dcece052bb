"""Every name ``swarmtrain`` re-exports resolves, and importing the package stays light."""

from __future__ import annotations

import subprocess
import sys

import swarmtrain


def test_every_public_name_resolves() -> None:
    missing = [n for n in swarmtrain.__all__ if getattr(swarmtrain, n, None) is None]
    assert not missing


def test_import_does_not_load_hivemind() -> None:
    code = (
        "import sys, swarmtrain; from swarmtrain import Int8Compressor, DiLoCo; "
        "print('hivemind' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
