"""``swarmtrain dashboard``: a local web page showing a run live, from the same records as ``status``.

``history`` keeps what successive polls showed (bounded), ``poller`` polls in a thread, ``server``
serves the page (``page``, self-contained) and its data as JSON.
"""

from __future__ import annotations

from swarmtrain.app.dashboard.history import OUTCOMES, History
from swarmtrain.app.dashboard.poller import Poller, Reader
from swarmtrain.app.dashboard.server import DashboardServer

__all__ = ["History", "Poller", "Reader", "DashboardServer", "OUTCOMES"]
