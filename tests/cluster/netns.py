"""Real network partitions: every host (a node, a worker) in a network namespace of its own,
all on one bridge, and nftables rules inside the namespaces to cut pairs of hosts.

``NetLab(["n1", "n2", "n3", "w1"])`` makes namespaces ``sdl<tag>-<name>``, each with one veth
(``eth0``, ``.<i+1>`` of a /24 that nothing on this machine routes or holds) on a bridge in the
root namespace, which holds ``.254``: the address of the test process itself, the *client*
(:data:`CLIENT`). Nothing is routed anywhere else, and no rule is ever added to the root
namespace. The tag carries the test process's PID: a lab whose process died without closing it
(killed by SIGKILL) is removed by the next lab made, and never shares its addresses.

- ``cut(a, b, ...)``: packets between a and each of the others are dropped - connections hang, as across a real
  partition (TCP retransmits, a connect waits for its timeout); ``cut(a, b, reject=True)``
  answers them with a reset or an ICMP error instead (refused at once).
- ``cut_one_way(src, dst)``: only the packets from src to dst are dropped (on arrival).
- ``loss(a, b, percent)``: that share of the packets between a and b dropped at random.
- ``heal()``: every cut and loss removed (``heal(a, b)``: the cut between those two).
- ``add(host)``: one more host, brought up while the lab runs (a new VM with a new address).
- ``run(host, args)``: a process in that host's namespace (``ip netns exec`` execs it: the
  returned ``Popen``'s pid is the process), stopped by :meth:`close`.

Root and ``ip``/``nft`` (Debian's iproute2 and nftables) are needed: :func:`available` says
whether this machine has them.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import shutil
import subprocess
from pathlib import Path

from tests.acceptance.netns import free_subnet

CLIENT = "client"
_labs = itertools.count()


def available() -> str | None:
    """None when namespaces with nftables rules can be made here, else why not."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "nft"):
        if shutil.which(tool) is None:
            return f"{tool} not installed (Debian: iproute2, nftables)"
    return None


_NS, _BRIDGE, _VETH = "sdl", "sdlb", "sdlv"


def _owner(tag: str) -> int:
    """The PID of the process that made the lab of ``tag``."""
    return int(tag[:-2], 16)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def sweep_dead_labs() -> list[str]:
    """Remove the namespaces and bridges of labs whose process is gone (one killed before it
    could close its lab); the names removed."""
    gone = []
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for line in namespaces.splitlines():
        name = line.split(" ")[0]
        m = re.fullmatch(rf"{_NS}([0-9a-f]+)-\S+", name)
        if m and len(m[1]) > 2 and not _alive(_owner(m[1])):
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
            gone.append(name)
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    for m in re.finditer(rf"^\d+: ({_BRIDGE}([0-9a-f]+))[:@]", links, re.M):
        if len(m[2]) > 2 and not _alive(_owner(m[2])):
            subprocess.run(["ip", "link", "del", m[1]], capture_output=True)
            gone.append(m[1])
    return gone


def _sh(*args: str) -> None:
    out = subprocess.run(args, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {out.stderr.strip()}")


class NetLab:
    def __init__(self, hosts: list[str]) -> None:
        assert CLIENT not in hosts and len(hosts) < 250
        # Unique per lab (a namespace's veth goes away some time after the namespace does):
        # the PID in hex and a count, within an interface name's 15 characters.
        self.tag = f"{os.getpid():x}{next(_labs) % 100:02d}"
        self.bridge = f"{_BRIDGE}{self.tag}"
        self.hosts = list(hosts)
        self.ns = {h: f"{_NS}{self.tag}-{h}" for h in hosts}
        sweep_dead_labs()
        self.subnet = free_subnet("10.100.0.0/16")
        self.ip = {h: self._addr(i + 1) for i, h in enumerate(hosts)}
        self.ip[CLIENT] = self._addr(254)
        self.cuts: dict[frozenset[str], bool] = {}  # pair -> reject (else drop)
        self.one_way: set[tuple[str, str]] = set()  # (src, dst): src's packets to dst dropped
        self.losses: dict[frozenset[str], int] = {}  # pair -> percent of packets dropped
        self.procs: list[subprocess.Popen[bytes]] = []
        self._made: list[str] = []
        self._applied: dict[str, list[str]] = {}  # per namespace, its rules now

    def __enter__(self) -> NetLab:
        try:
            self._setup()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _addr(self, host: int) -> str:
        return str(self.subnet.network_address + host)

    def _setup(self) -> None:
        _sh("ip", "link", "add", self.bridge, "type", "bridge")
        self._made.append("bridge")
        _sh("ip", "addr", "add", f"{self.ip[CLIENT]}/24", "dev", self.bridge)
        _sh("ip", "link", "set", self.bridge, "up")
        for i, host in enumerate(self.hosts):
            self._host(i, host)

    def _host(self, i: int, host: str) -> None:
        ns, veth = self.ns[host], f"{_VETH}{self.tag}{i}"
        _sh("ip", "netns", "add", ns)
        self._made.append(ns)
        _sh("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _sh("ip", "link", "set", veth, "master", self.bridge, "up")
        _sh("ip", "-n", ns, "addr", "add", f"{self.ip[host]}/24", "dev", "eth0")
        _sh("ip", "-n", ns, "link", "set", "eth0", "up")
        _sh("ip", "-n", ns, "link", "set", "lo", "up")
        self._nft(host, "add table inet lab")
        for chain in ("input", "output"):
            self._nft(
                host, f"add chain inet lab {chain} {{ type filter hook {chain} priority 0; }}"
            )

    def add(self, host: str) -> str:
        """One more host while the lab runs (a new VM): a namespace of its own on the bridge,
        with the next address (never one a host had before); returns that address."""
        assert host not in self.hosts and host != CLIENT and len(self.hosts) < 249
        i = len(self.hosts)
        self.hosts.append(host)
        self.ns[host] = f"{_NS}{self.tag}-{host}"
        self.ip[host] = self._addr(i + 1)
        self._host(i, host)
        return self.ip[host]

    def _nft(self, host: str, command: str) -> None:
        _sh("ip", "netns", "exec", self.ns[host], "nft", command)

    def _nft_script(self, host: str, lines: list[str]) -> None:
        """Several nft commands in one transaction (all or none applied)."""
        out = subprocess.run(
            ["ip", "netns", "exec", self.ns[host], "nft", "-f", "-"],
            input="\n".join(lines) + "\n",
            capture_output=True,
            text=True,
        )
        if out.returncode != 0:
            raise RuntimeError(f"nft -f in {self.ns[host]}: {out.stderr.strip()}")

    # -- faults ------------------------------------------------------------------------------
    def cut(self, a: str, *others: str, reject: bool = False) -> None:
        for b in others:
            self.cuts[frozenset((a, b))] = reject
        self._apply()

    def cut_one_way(self, src: str, dst: str) -> None:
        assert dst != CLIENT, "no rule is ever added to the root namespace (the client's)"
        self.one_way.add((src, dst))
        self._apply()

    def loss(self, a: str, b: str, percent: int) -> None:
        assert CLIENT not in (a, b), "no rule is ever added to the root namespace (the client's)"
        self.losses[frozenset((a, b))] = percent
        self._apply()

    def heal(self, a: str | None = None, b: str | None = None) -> None:
        if a is None or b is None:
            self.cuts.clear()
            self.one_way.clear()
            self.losses.clear()
        else:
            self.cuts.pop(frozenset((a, b)), None)
        self._apply()

    def _apply(self) -> None:
        """Each namespace's rules, rebuilt from :attr:`cuts`, :attr:`one_way` and
        :attr:`losses` (a host drops what it sends to and receives from the other end of each
        of its cuts, what arrives along a one-way cut, and a share of what arrives from the
        other end of a lossy pair), in one nft transaction per namespace whose rules change."""
        for host in self.hosts:
            rules = ["flush table inet lab"]
            for pair, reject in self.cuts.items():
                if host not in pair:
                    continue
                peer = self.ip[next(iter(pair - {host}))]
                verdict = "reject with tcp reset" if reject else "drop"
                tcp = "meta l4proto tcp " if reject else ""
                rules.append(f"add rule inet lab input ip saddr {peer} {tcp}{verdict}")
                rules.append(f"add rule inet lab output ip daddr {peer} {tcp}{verdict}")
            # Dropped where they arrive, as a network loses them: a packet dropped on its way
            # out fails the sender's send (EPERM), which no real network does.
            for src, dst in sorted(self.one_way):
                if host == dst:
                    rules.append(f"add rule inet lab input ip saddr {self.ip[src]} drop")
            for pair, percent in self.losses.items():
                if host in pair:
                    peer = self.ip[next(iter(pair - {host}))]
                    rules.append(
                        f"add rule inet lab input ip saddr {peer} "
                        f"numgen random mod 100 < {percent} drop"
                    )
            if self._applied.get(host, ["flush table inet lab"]) != rules:
                self._nft_script(host, rules)
                self._applied[host] = rules

    # -- processes ---------------------------------------------------------------------------
    def prefix(self, host: str) -> list[str]:
        """The command prefix that runs a program in ``host``'s namespace."""
        return ["ip", "netns", "exec", self.ns[host]]

    def run(
        self, host: str, args: list[str], log: Path, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                self.prefix(host) + args, stdout=out, stderr=subprocess.STDOUT, env=env
            )
        self.procs.append(proc)
        return proc

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
        for name in reversed(self._made):
            if name == "bridge":
                subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
            else:
                subprocess.run(["ip", "netns", "del", name], capture_output=True)
        self._made.clear()
