"""What the worker SDK and the server must agree on besides the frames: where a worker
connects, and how long each end waits during the handshake.  Declared once, here; their order
is tested (tests/unit/test_protocol_timing.py)."""

from __future__ import annotations

from typing import Final

#: the websocket a worker connects to (the API's operation table serves it at this path)
CONNECT_PATH: Final = "/api/v1/workers/connect"
#: the server waits this long for a new connection's hello before it closes it (s)
HELLO_TIMEOUT_S: Final = 10.0
#: a hello that reaches a node which neither leads nor knows a leader it can reach (an
#: election is going on) is held up to this long until it does, then answered (s)
HELLO_HOLD_S: Final = 3.0
#: the worker waits this long from the upgrade for the welcome or the redirect (s): longer
#: than a server may hold its hello, or every worker of a fleet would give up during an
#: election and connect again
HANDSHAKE_TIMEOUT_S: Final = 10.0
