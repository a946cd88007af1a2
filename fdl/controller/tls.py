"""TLS for the training port: a key the controller makes per instance, pinned through the run's token.

Every connection to a controller is TLS 1.3. The controller makes an ECDSA
P-256 key and a self-signed certificate for it when it starts (`ServerKey`,
with `cryptography`), never writes the key to disk (it reaches OpenSSL
through an anonymous memory file), and names the key's hash in its signed
`GET /join/id` answer. No certificate authority is involved: a client that
holds the run's token trusts the key because the token-proved answer names
it, and checks it against the certificate this very connection presented
(kubeadm's `--discovery-token-ca-cert-hash`, with the shared token as the
root of trust). A client without the token gets encryption, not
authentication, and says so.

The key's identity is the SHA-256 of its DER SubjectPublicKeyInfo (SPKI),
the value `curl --pinnedpubkey sha256//BASE64` and HPKP use.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import os
import ssl
from dataclasses import dataclass

from fdl.errors import FdlError

CERT_DAYS = 3650  # nobody checks it: clients pin the key, and a controller lives as long as its launcher


@dataclass(frozen=True)
class ServerKey:
    """One controller instance's TLS key: the server context holding it and its SPKI SHA-256."""

    context: ssl.SSLContext
    spki: bytes  # SHA-256 of the DER SubjectPublicKeyInfo

    @property
    def spki_hex(self) -> str:
        return self.spki.hex()

    @property
    def pin(self) -> str:
        """The key as curl pins it: `sha256//BASE64`."""
        return curl_pin(self.spki)


def curl_pin(spki: bytes) -> str:
    return "sha256//" + base64.b64encode(spki).decode()


def make_server_key(label: str) -> ServerKey:
    """A fresh ECDSA P-256 key and a self-signed certificate for it (CN "fdl controller LABEL"), loaded into a
    TLS 1.3-only server context. The PEM goes to OpenSSL through a memfd, never through a file on disk."""
    pem, spki = self_signed_pem(label)
    context = server_context()
    try:
        fd = os.memfd_create("fdl-controller-key", os.MFD_CLOEXEC)
    except (AttributeError, OSError) as exc:  # pragma: no cover - Linux has had memfd since 3.17
        raise FdlError(f"the controller cannot make its TLS key here: no anonymous memory files ({exc}).") from None
    try:
        os.write(fd, pem)
        context.load_cert_chain(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)
    return ServerKey(context, spki)


def self_signed_pem(label: str) -> tuple[bytes, bytes]:
    """(certificate and private key as PEM, the key's SPKI SHA-256): a new ECDSA P-256 key, self-signed."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"fdl controller {label}"[:64])])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=CERT_DAYS))
            .sign(key, hashes.SHA256()))
    pem = cert.public_bytes(serialization.Encoding.PEM) + key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    spki = hashlib.sha256(key.public_key().public_bytes(serialization.Encoding.DER,
                                                        serialization.PublicFormat.SubjectPublicKeyInfo)).digest()
    return pem, spki


def server_context() -> ssl.SSLContext:
    """TLS 1.3 only, no session tickets (no client resumes, and each would cost a ticket's encryption)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.num_tickets = 0
    return context


def client_context() -> ssl.SSLContext:
    """TLS 1.3 only, no certificate authority and no name check: the key is checked by its pin instead
    (spki_of on the peer certificate, against the one a token-proved answer named)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def spki_of(der_certificate: bytes) -> bytes:
    """SHA-256 of the SubjectPublicKeyInfo of a DER certificate (what a peer presented on a connection)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    public = x509.load_der_x509_certificate(der_certificate).public_key()
    return hashlib.sha256(public.public_bytes(serialization.Encoding.DER,
                                              serialization.PublicFormat.SubjectPublicKeyInfo)).digest()
