"""Keep pysyncobj's forked snapshot writer from outliving, or blocking, the daemon.

pysyncobj 0.3.17 writes a snapshot (log compaction) in a child it forks from the tick thread
(``Serializer.serialize``: ``os.fork()``; the child pickles the state into
``<fullDumpFile>.tmp``, renames it over ``<fullDumpFile>`` and leaves with ``os._exit``; the
parent polls it with ``waitpid`` and compacts the journal only after a zero exit status).  The
child inherits every descriptor of the daemon, the listening sockets of the Raft port and of the
HTTP API included, so a daemon SIGKILLed while a large snapshot was being written (minutes at
10^5+ jobs) could not restart ("address already in use") until the orphaned writer finished.

:func:`guard_snapshot_fork` wraps the serializer of one ``SyncObj`` so that, in the child of
*that* fork only, right after ``fork()`` returns and before it does any work:

1. every inherited socket (descriptors 3 and up) is released, so a killed daemon's ports and
   connections are closed by the kernel at once;
2. the child asks for SIGKILL when its parent dies (Linux ``PR_SET_PDEATHSIG``), and leaves at
   once if the parent is already gone, so a killed node leaves no orphaned writer behind.

(2) is needed as much as (1): with the ports free, a supervisor restarts the node while an
orphaned writer would still be writing ``<fullDumpFile>.tmp``, and pysyncobj's file names are
fixed.  The restarted node's own writer would open the same ``.tmp`` (truncating it, same
inode) and both would write into it; whichever renamed first would install a mix of the two, or
the orphan could rename an *older* snapshot over a newer one after the new process had already
compacted its journal past it (entries lost on the next start).  Killing the orphan is safe: it
never touched ``<fullDumpFile>`` (only the rename does, atomically, as its last act), and the
old process never compacted its journal for a snapshot whose writer did not exit 0, so the
restarted node loads the previous complete snapshot plus the whole journal.  A partial
``.tmp`` is truncated by the next snapshot.  The kernel sends the signal while the dying thread
exits, before whoever waits for the node can see it gone, so by the time a new process starts
the writer is dead but for the one system call it may have been in (a rename then installs a
complete snapshot, which the uncompacted journal still extends).  Note that for ``PR_SET_PDEATHSIG`` the "parent"
is the *thread* that forked, pysyncobj's tick thread: a snapshot still being written when the
node is destroyed (graceful stop) is abandoned the same way, which is as safe.

Only Linux is covered (``/proc/self/fd``, ``prctl``); elsewhere the hook does nothing.
"""

from __future__ import annotations

import ctypes
import os
import signal
import stat
import sys
import threading
from collections.abc import Callable
from typing import Any

_PR_SET_PDEATHSIG = 1
_FD_DIR = "/proc/self/fd"

#: ident of each thread currently inside a guarded ``serialize`` -> pid of the daemon.  A forked
#: child keeps only the thread that called ``fork()``, with the same ident, so the hook can tell
#: a snapshot writer from any other child of the daemon (for instance a subprocess with a
#: ``preexec_fn``, which also runs the at-fork hooks: its sockets must stay untouched).
_armed: dict[int, int] = {}
_install_lock = threading.Lock()
_installed = False
_prctl: Callable[..., int] | None = None


def _load_prctl() -> Callable[..., int] | None:
    """libc's ``prctl``, looked up in the daemon (never in the child)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    # prctl(int option, unsigned long arg2, ...): whole registers, whatever the ABI
    fn.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    fn.restype = ctypes.c_int
    prctl: Callable[..., int] = fn
    return prctl


def install() -> None:
    """Register the after-fork hook, once per process (``os.register_at_fork`` hooks cannot be
    removed; the hook does nothing in a child that :func:`guard_snapshot_fork` did not arm)."""
    global _installed, _prctl
    with _install_lock:
        if _installed:
            return
        _prctl = _load_prctl()
        os.register_at_fork(after_in_child=_after_fork_in_child)
        _installed = True


def guard_snapshot_fork(obj: Any) -> None:
    """Arm the after-fork hook around ``obj``'s snapshot writes.

    pysyncobj calls ``self.__serializer.serialize(data, id)`` on the tick thread from
    ``__tryLogCompaction``, and forks inside it; an instance attribute shadows the method."""
    install()
    serializer = obj._SyncObj__serializer
    inner = serializer.serialize

    def serialize(data: Any, ident: Any) -> Any:
        thread = threading.get_ident()
        _armed[thread] = os.getpid()
        try:
            return inner(data, ident)
        finally:  # in the parent: the child never returns from inner (os._exit)
            _armed.pop(thread, None)

    serializer.serialize = serialize


def _after_fork_in_child() -> None:
    parent = _armed.get(threading.get_ident())
    _armed.clear()  # this process is a snapshot writer now, never a daemon
    if parent is None:
        return  # not pysyncobj's snapshot fork: leave this child alone
    release_sockets()
    die_with_parent(parent)


def release_sockets() -> None:
    """Drop this process's reference to every socket it inherited (descriptors 3 and up).

    Why this cannot disturb the daemon (the parent):

    * A descriptor is a reference to an open file description shared with the parent.  The
      socket (listening or connected) lives until its *last* reference goes, so dropping the
      child's copies sends no FIN or RST, empties no accept queue and changes nothing the
      parent sees.  Only ``shutdown()`` acts on the shared socket itself, and the child never
      calls it (after this, any such call would fail with ENOTSOCK on /dev/null).
    * pysyncobj polls with ``poll(2)`` (its PollPoller keeps the descriptor set in the parent's
      memory; nothing is registered in the kernel).  The event loop's epoll instance (uvloop
      or asyncio) is shared with the child, but an epoll registration goes away only when
      every descriptor of the registered open file description is closed, and the parent
      still holds its own; the child never calls ``epoll_ctl`` or runs the loop.
    * The child's own work (pickle the state, write ``<fullDumpFile>.tmp``, rename, ``_exit``)
      uses no socket; the replicated state holds none (docs/pysyncobj.md #9).

    Each socket descriptor is replaced with /dev/null (``dup2``, which closes the socket
    atomically) rather than just closed, so its number stays taken and the snapshot file
    opened next cannot get a socket's old number.  That matters: the daemon's signal wakeup
    descriptor is a socket (uvloop's socketpair; ``add_signal_handler`` for SIGTERM, SIGINT,
    SIGHUP, SIGUSR1), and Python's C signal handler, inherited by the child, writes the signal
    number to it -- a signal delivered to the writer (systemd signals the whole cgroup) would
    write a byte into the snapshot had the number been reused.  Without any of this it went
    to the parent's loop, which ran its handler as if the daemon had been signalled (seen with
    SIGUSR1; a SIGTERM to the writer would stop the daemon).  Now it goes to /dev/null, as does a stray close or write through a leftover
    socket object (a finalizer run by the garbage collector while pickling).  0-2 are kept:
    they are not ports (under systemd, 1 and 2 are the journal's stream socket), and a fatal
    error printed by the child still reaches the log.
    """
    try:
        names = os.listdir(_FD_DIR)
    except OSError:
        return  # no /proc (not Linux): nothing done
    null = -1
    for name in names:
        fd = int(name)
        if fd <= 2:
            continue
        try:
            if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                continue
        except OSError:
            continue  # the listing's own directory descriptor, closed by now
        if null < 0:
            try:
                null = os.open(os.devnull, os.O_RDWR)
            except OSError:
                null = -2  # no /dev/null: close instead
        try:
            if null >= 0:
                os.dup2(null, fd)
            else:
                os.close(fd)
        except OSError:
            pass
    if null >= 0:
        os.close(null)


def die_with_parent(parent: int) -> None:
    """SIGKILL this process when the thread that forked it ends (Linux), and leave now if the
    parent died before that was in place (the usual re-check of ``PR_SET_PDEATHSIG``)."""
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)  # orphaned already: write nothing (the parent never waits for us)
