"""Addresses and TLS trust, the same for the daemon's config, ``schedctl`` and the worker SDK.

Each caller names its own setting in front of the message (``http.tls_ca``, ``--cacert``,
``SCHEDD_CACERT``, the SDK's ``cafile``) and raises what its users expect (a config problem, a
usage error, a ``ValueError``); what is wrong with the file is said here, once.
"""

from __future__ import annotations

import ipaddress
import os
import ssl
from collections.abc import Callable

PEM_CERT = b"-----BEGIN CERTIFICATE-----"


class TrustError(ValueError):
    """A file of CA certificates that cannot be used: the message names it and says why."""


def ca_context(path: str | os.PathLike[str], show: Callable[[str], str] = repr) -> ssl.SSLContext:
    """A client TLS context that trusts only the CA certificates in ``path`` (PEM), or
    :class:`TrustError`; ``show`` quotes the path as the caller's users write it."""
    name = show(os.fspath(path))
    try:
        with open(path, "rb") as fh:
            pem = fh.read()
    except FileNotFoundError:
        raise TrustError(f"file {name} not found") from None
    except IsADirectoryError:
        raise TrustError(f"{name} is a directory, expected a PEM file") from None
    except OSError as exc:
        raise TrustError(f"cannot read {name}: {exc.strerror or exc}") from None
    if PEM_CERT not in pem:
        raise TrustError(
            f"{name} holds no PEM certificate (expected the CA certificate that signed the "
            'servers\', a "-----BEGIN CERTIFICATE-----" block)'
        )
    try:
        return ssl.create_default_context(cafile=path)
    except (ssl.SSLError, ValueError) as exc:
        raise TrustError(f"cannot load the certificates in {name}: {exc}") from None


def is_loopback(host: str) -> bool:
    """``localhost``, ``127.0.0.0/8`` or ``::1`` (also IPv4-mapped, with or without brackets);
    host names are never resolved."""
    host = host.strip("[]")
    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped.is_loopback
    return ip.is_loopback
