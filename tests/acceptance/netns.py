"""Network namespaces joined by a Linux bridge: a few "VMs" on one private /24, for tests that
need real distinct IP addresses (root only).

    with Lab() as lab:
        lab.add_host("n1", 1)                       # namespace sd<pid>n1, address .1
        subprocess.run(["ip", "netns", "exec", lab.ns("n1"), ...])

The root namespace gets ``.254`` on the bridge, so a process of the test can reach every host.
Every name carries the test's PID (interface names stay within 15 characters) and everything
made is recorded and removed by :meth:`Lab.close`, whatever happened, in reverse order.
"""

from __future__ import annotations

import ipaddress
import json
import os
import random
import subprocess
from types import TracebackType

ROOT_HOST = 254


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and out.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed ({out.returncode}): {out.stderr.strip()}")
    return out


def used_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 destination in any routing table, and every address on any interface."""
    nets: list[ipaddress.IPv4Network] = []
    for route in json.loads(ip("-j", "-4", "route", "show", "table", "all").stdout or "[]"):
        dst = route.get("dst", "")
        if dst and dst != "default":
            nets.append(ipaddress.IPv4Network(dst, strict=False))
    for link in json.loads(ip("-j", "-4", "addr", "show").stdout or "[]"):
        for a in link.get("addr_info", []):
            nets.append(ipaddress.IPv4Network(f"{a['local']}/{a['prefixlen']}", strict=False))
    return nets


def free_subnet(prefix: str = "10.213.0.0/16") -> ipaddress.IPv4Network:
    """A /24 inside ``prefix`` that overlaps nothing routed or addressed on this machine."""
    used = used_networks()
    candidates = list(ipaddress.IPv4Network(prefix).subnets(new_prefix=24))
    start = (os.getpid() + random.randrange(len(candidates))) % len(candidates)
    for net in candidates[start:] + candidates[:start]:
        if not any(net.overlaps(u) for u in used):
            return net
    raise RuntimeError(f"no free /24 in {prefix}")


class Lab:
    def __init__(self, tag: str | None = None) -> None:
        self.tag = tag or str(os.getpid())
        self.subnet = free_subnet()
        self.bridge = f"sdbr{self.tag}"
        assert len(self.bridge) <= 15, self.bridge
        self.hosts: dict[str, int] = {}
        self._undo: list[list[str]] = []

    def addr(self, host: int) -> str:
        return str(self.subnet.network_address + host)

    def ns(self, name: str) -> str:
        return f"sd{self.tag}{name}"

    def __enter__(self) -> Lab:
        try:
            self._do(
                ["link", "add", self.bridge, "type", "bridge"], undo=["link", "del", self.bridge]
            )
            ip("addr", "add", f"{self.addr(ROOT_HOST)}/{self.subnet.prefixlen}", "dev", self.bridge)
            ip("link", "set", self.bridge, "up")
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _do(self, args: list[str], undo: list[str]) -> None:
        ip(*args)
        self._undo.append(undo)

    def add_host(self, name: str, host: int) -> str:
        """A namespace with ``lo`` up and ``eth0`` at ``.host`` on the bridge; its name."""
        ns = self.ns(name)
        outer, inner = f"sdv{name}{self.tag}", f"sdp{name}{self.tag}"
        assert len(outer) <= 15 and len(inner) <= 15, (outer, inner)
        self._do(["netns", "add", ns], undo=["netns", "del", ns])
        self._do(
            ["link", "add", outer, "type", "veth", "peer", "name", inner],
            undo=["link", "del", outer],
        )
        ip("link", "set", outer, "master", self.bridge)
        ip("link", "set", outer, "up")
        ip("link", "set", inner, "netns", ns)
        ip("-n", ns, "link", "set", inner, "name", "eth0")
        ip("-n", ns, "addr", "add", f"{self.addr(host)}/{self.subnet.prefixlen}", "dev", "eth0")
        ip("-n", ns, "link", "set", "eth0", "up")
        ip("-n", ns, "link", "set", "lo", "up")
        self.hosts[name] = host
        return ns

    def close(self) -> list[str]:
        """Undo everything, newest first; the problems met (each step is tried regardless)."""
        problems = []
        while self._undo:
            args = self._undo.pop()
            out = ip(*args, check=False)
            if out.returncode != 0 and "Cannot find device" not in out.stderr:
                problems.append(f"ip {' '.join(args)}: {out.stderr.strip()}")
        return problems

    def leftovers(self) -> list[str]:
        """Names of this lab's namespaces and links that still exist (for a teardown check)."""
        names = ip("-o", "link", "show").stdout + ip("netns", "list").stdout
        return sorted(
            {
                w.split("@")[0].rstrip(":")
                for w in names.split()
                if self.tag in w and (w.startswith(("sd", f"sd{self.tag}")))
            }
        )
