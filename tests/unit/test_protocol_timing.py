"""The worker SDK and the server agree on where a worker connects and on the handshake's waits
(schedd/protocol/timing.py): each end uses those declarations, in the order that works."""

from __future__ import annotations

from schedd.api.operations import OPERATIONS
from schedd.protocol import timing


def test_the_worker_waits_for_its_welcome_longer_than_a_server_holds_a_hello() -> None:
    # a fleet held through an election is answered before it gives up and reconnects
    assert 0 < timing.HELLO_HOLD_S < timing.HANDSHAKE_TIMEOUT_S
    # and the server waits for the hello as long as a worker waits for its answer
    assert timing.HELLO_TIMEOUT_S >= timing.HANDSHAKE_TIMEOUT_S - timing.HELLO_HOLD_S


def test_the_api_serves_the_worker_protocol_where_the_sdk_connects() -> None:
    [op] = [op for op in OPERATIONS if op.op_id == "worker_connect"]
    assert op.path == timing.CONNECT_PATH
