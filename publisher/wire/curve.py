"""CURVE for addresses beyond loopback: one key pair per job, made by ``tuimon keys``, kept 0600.

On one node, loopback and ``ipc://`` sockets in the private runtime folder keep other machines
out. Across nodes, anyone who can reach a port could read every run and talk to its sockets, so a
socket bound beyond loopback requires CURVE, ZeroMQ's own authenticated encryption (RFC 26,
CurveZMQ): the binding side is a CURVE server that only lets in clients holding the job's key
(ZAP, RFC 27, through pyzmq's :class:`zmq.auth.thread.ThreadAuthenticator`), and every client
proves it holds the secret. One key pair serves the whole job: the secret file is the credential,
kept readable by its owner only, like an SSH key. The files are pyzmq's own certificate format
(:func:`zmq.auth.create_certificates`): ``<name>.key`` (public) and ``<name>.key_secret``.

A peer without the key is refused during the handshake, before it can read or send anything; both
sides say so (:func:`refusal`), from their sockets' monitor events.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq
import zmq.auth

#: Where a process finds the job's keys when not told: this file, else the default below.
ENV_KEYS = "TUIMON_KEYS"
#: Set to 1 to bind beyond loopback without CURVE anyway (everyone who can reach it reads it).
ENV_INSECURE = "TUIMON_INSECURE"
KEY_NAME = "job"
#: pyzmq's authenticator logs every decision at INFO/DEBUG; refusals are reported by :func:`refusal`.
_QUIET = logging.getLogger("tuimon.curve.zap")
_QUIET.addHandler(logging.NullHandler())
_QUIET.propagate = False


def default_keys_file() -> Path:
    """``$XDG_CONFIG_HOME/tuimon/keys/job.key_secret`` (``~/.config`` when unset)."""
    config = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config) / "tuimon" / "keys" / f"{KEY_NAME}.key_secret"


@dataclass(frozen=True)
class JobKeys:
    """The job's key pair (Z85-encoded, as ZeroMQ takes them) and the secret file it came from."""

    public: bytes
    secret: bytes
    path: Path

    def serve(self, sock: zmq.Socket) -> None:
        """Make ``sock`` (before it binds) a CURVE server."""
        sock.curve_secretkey = self.secret
        sock.curve_publickey = self.public
        sock.curve_server = True

    def join(self, sock: zmq.Socket) -> None:
        """Make ``sock`` (before it connects) a CURVE client of a server holding these keys."""
        sock.curve_secretkey = self.secret
        sock.curve_publickey = self.public
        sock.curve_serverkey = self.public


def make_keys(secret_file: Path, *, replace: bool = False) -> Path:
    """Create the job's key pair as ``secret_file`` (``<name>.key_secret``, mode 0600) with its
    public half beside it (``<name>.key``), in a folder created private (0700)."""
    if not secret_file.name.endswith(".key_secret"):
        raise ValueError(f"the secret key file's name must end in .key_secret, got {secret_file.name!r}")
    if secret_file.exists() and not replace:
        raise ValueError(
            f"{secret_file} already exists: keep it (every node of the job uses the same "
            "keys), or make new ones with --replace and copy them to every node"
        )
    folder = secret_file.parent
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    public_file, made_secret = zmq.auth.create_certificates(folder, secret_file.name[: -len(".key_secret")])
    os.chmod(made_secret, 0o600)
    os.chmod(public_file, 0o644)
    return Path(made_secret)


def load_keys(path: str | os.PathLike[str] | None = None, *, required: bool = False) -> JobKeys | None:
    """The job's keys from ``path``, else ``$TUIMON_KEYS``, else the default file; None when no
    file is there and none was named (``required`` makes that an error too). ValueError, naming
    the file, for a file that is unreadable, not a secret key, or readable by others."""
    named = path or os.environ.get(ENV_KEYS)
    secret_file = Path(named).expanduser() if named else default_keys_file()
    if not secret_file.exists():
        if named or required:
            raise ValueError(
                f"no CURVE keys at {secret_file}: make them with `tuimon keys` (once per job, "
                "then copy the file to every node)"
            )
        return None
    mode = secret_file.stat().st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ValueError(
            f"{secret_file} is readable by other users (mode {stat.filemode(mode)}): "
            f"`chmod 600 {secret_file}`; whoever reads it can join the job"
        )
    try:
        public, secret = zmq.auth.load_certificate(secret_file)
    except (OSError, ValueError) as exc:
        raise ValueError(f"{secret_file} is not a CURVE secret key file ({exc})") from None
    if not secret:
        raise ValueError(f"{secret_file} holds no secret key: give the .key_secret file, not the .key")
    return JobKeys(public, secret, secret_file)


def insecure_allowed() -> bool:
    return os.environ.get(ENV_INSECURE) == "1"


def beyond_loopback(endpoint: str) -> bool:
    """Whether ``endpoint`` (bound or connected to) reaches beyond this machine: tcp on an address
    that is not loopback (``ipc://`` never does)."""
    if not endpoint.startswith("tcp://"):
        return False
    host = endpoint[len("tcp://") :].rpartition(":")[0].strip("[]")
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host != "localhost"


def server_keys(endpoint: str, keys: JobKeys | None, *, insecure: bool, what: str) -> JobKeys | None:
    """The keys a socket binding ``endpoint`` serves CURVE with: None on loopback; beyond it, the
    job's keys, or a ValueError that says how to get them (or to pass ``insecure``)."""
    if not beyond_loopback(endpoint) or insecure:
        return None
    if keys is None:
        raise ValueError(
            f"{what} on {endpoint} would be reachable from other machines: that needs CURVE keys "
            f"(`tuimon keys`, then --keys FILE or ${ENV_KEYS}); or bind to 127.0.0.1, or accept "
            f"that anyone who can reach it reads it with --insecure (${ENV_INSECURE}=1)"
        )
    return keys


def client_keys(endpoint: str, keys: JobKeys | None, *, explicit: bool) -> JobKeys | None:
    """The keys a socket connecting to ``endpoint`` joins with: the keys when they were named
    (``--keys``), else when found and the address is beyond loopback (servers there require them);
    None for the plain loopback connections of one node."""
    return keys if keys is not None and (explicit or beyond_loopback(endpoint)) else None


class Guard:
    """The ZAP handler of one ZeroMQ context: lets in CURVE clients holding the job's key, and
    nobody else. Start it before binding; stop it when the context's sockets are closed."""

    def __init__(self, context: zmq.Context, keys: JobKeys) -> None:
        # Imported here, with CURVE only: zmq.auth.thread imports asyncio (15 ms of every
        # publisher's start-up otherwise, python -X importtime).
        from zmq.auth.thread import ThreadAuthenticator

        self._public = keys.public
        self._authenticator = ThreadAuthenticator(context, log=_QUIET)
        self._authenticator.start()
        self._authenticator.configure_curve_callback(domain="*", credentials_provider=self)

    def callback(self, domain: str, key: bytes) -> bool:
        """ZAP's question (pyzmq's credentials-provider interface): is this client key the job's?
        ``key`` arrives Z85-encoded, as the job's public key is kept."""
        return key == self._public

    def stop(self) -> None:
        self._authenticator.stop()


#: Monitor events that mean a handshake failed, for :func:`refusal`.
HANDSHAKE_FAILURES = (
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)
#: Protocol errors (a monitor event's value, ZMTP 3.1 / RFC 23 and RFC 26) that mean the two sides'
#: CURVE keys differ: the mechanism's own cryptography or key exchange failed.
_KEY_MISMATCH = (zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC, zmq.PROTOCOL_ERROR_ZMTP_KEY_EXCHANGE)
_GET_KEYS = "`tuimon keys` once per job; give the file with --keys or $TUIMON_KEYS"


def refusal(event: Mapping[str, Any], *, serving: bool) -> str:
    """What to tell the user about a failed handshake (a parsed socket monitor ``event``), on
    either side. Only a failure that CURVE caused is called a CURVE refusal: libzmq says which
    kind it was (authentication, a protocol error and its code, or a peer that broke off), and a
    port taken by some other program must not send the user off to copy keys."""
    kind, value = event["event"], event["value"]
    endpoint = event["endpoint"].decode(errors="replace")
    if kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
        if serving:
            return f"refused a connection on {endpoint}: the peer's CURVE key is not this job's"
        return f"{endpoint} refused us: our CURVE key is not the job's (copy its keys file here, --keys FILE)"
    if kind == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL and value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
        if serving:
            return (
                f"refused a connection on {endpoint}: the peer uses no CURVE ({_GET_KEYS}), "
                "or uses CURVE where this side does not"
            )
        return (
            f"cannot talk to {endpoint}: it requires CURVE and we have no key for it, or it has none and we "
            f"do ({_GET_KEYS})"
        )
    if kind == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL and value in _KEY_MISMATCH:
        return f"the CURVE handshake on {endpoint} failed: the two sides hold other job keys ({_GET_KEYS})"
    side = "a peer of" if serving else "the program at"
    reason = (
        f"broke off the handshake ({os.strerror(value)})"
        if kind == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
        else f"broke the ZeroMQ protocol (error {value:#x})"
    )
    return (
        f"{side} {endpoint} {reason}: it is not a tuimon socket, or it holds other CURVE keys than ours; "
        "is this the right address?"
    )
