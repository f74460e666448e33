"""A replica's front end on several cores: gRPC edge processes in front of one core process.

context.py   RelayContext: a relayed call's servicer context in the core
core.py      RelayServicer: the core's end of each edge's Relay stream, a batch an engine step
edge.py      an edge process: Generate relayed, every other method passed through
edges.py     Edges: the core starts, watches, restarts and stops its edges
"""

from .core import Registry, RelayServicer, relay_server, relayed_handlers
from .edges import Edges

__all__ = ["Edges", "Registry", "RelayServicer", "relay_server", "relayed_handlers"]
