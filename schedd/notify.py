"""systemd's notify protocol, spoken directly over ``$NOTIFY_SOCKET`` (no libsystemd).

``READY=1`` once Raft is bound and the API listens, ``WATCHDOG=1`` at half the watchdog
interval while the event loop is healthy, ``STOPPING=1`` on shutdown.  Without
``NOTIFY_SOCKET`` (not under systemd) every call is a no-op.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket


class Notifier:
    def __init__(self, env: dict[str, str] | None = None) -> None:
        env = dict(os.environ) if env is None else env
        self.address = env.get("NOTIFY_SOCKET") or None
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        self.watchdog_s: float | None = None
        if usec.isdigit() and int(usec) > 0 and (not pid or pid == str(os.getpid())):
            self.watchdog_s = int(usec) / 1_000_000

    def send(self, message: str) -> bool:
        if not self.address:
            return False
        address = self.address
        if address.startswith("@"):  # abstract namespace socket
            address = "\0" + address[1:]
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.connect(address)
                sock.sendall(message.encode())
            return True
        except OSError:
            return False

    def ready(self, status: str = "") -> None:
        self.send("READY=1" + (f"\nSTATUS={status}" if status else ""))

    def stopping(self) -> None:
        self.send("STOPPING=1")

    async def watchdog(self) -> None:
        """Ping at half the interval for as long as the event loop keeps running us."""
        if self.watchdog_s is None:
            return
        with contextlib.suppress(asyncio.CancelledError):
            while True:
                self.send("WATCHDOG=1")
                await asyncio.sleep(self.watchdog_s / 2)
