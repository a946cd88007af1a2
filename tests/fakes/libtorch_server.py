"""A small fake libtorch and real HTTP(S) servers that hand it out the way PyTorch's download location does.

- `fake_archive(variant)`: a libtorch zip in PyTorch's layout (one top-level libtorch/ holding lib/,
  include/ and build-version "2.13.0+<variant>"), a few hundred bytes; `corrupt_crc()` flips one byte of a
  stored member so its CRC-32 fails while the zip's structure stays readable.
- `LibtorchServer`: a real HTTP server on a free loopback port serving a dict of paths; a path may be
  "dropped" (the full Content-Length announced, half the bytes sent, the connection closed) or redirected.
  `official_path(variant)` is where PyTorch keeps an archive; `fdl_path(variant)` fdl's mirror naming.
- `PyTorchOverTls`: the official location itself, for real: a TLS server with a certificate for
  download.pytorch.org (signed by a throwaway CA) behind an HTTP CONNECT proxy on loopback. A client
  given HTTPS_PROXY and REQUESTS_CA_BUNDLE (`.env`) talks HTTPS to "download.pytorch.org" without this
  machine reaching the internet; the proxy records every CONNECT target.
"""

from __future__ import annotations

import contextlib
import datetime
import http.server
import io
import select
import socket
import socketserver
import ssl
import threading
import zipfile
from pathlib import Path
from urllib.parse import unquote

RELEASE = "2.13.0"
MARKER = b"\x7fELF fake libtorch for fdl's tests\n"


def fake_archive(variant: str, version: str = RELEASE, *, top: str = "libtorch/", build_version: bool = True,
                 extra: dict[str, bytes] | None = None) -> bytes:
    """A libtorch zip (stored, uncompressed: its bytes can be corrupted precisely)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr(top + "lib/libtorch.so", MARKER)
        zf.writestr(top + "include/torch/torch.h", b"// header\n")
        if build_version:
            zf.writestr(top + "build-version", f"{version}+{variant}\n")
        for name, data in (extra or {}).items():
            zf.writestr(top + name, data)
    return buf.getvalue()


def corrupt_crc(archive: bytes) -> bytes:
    """The archive with one byte of lib/libtorch.so's content flipped: readable, but its CRC fails."""
    at = archive.index(MARKER) + 5
    return archive[:at] + bytes([archive[at] ^ 0xFF]) + archive[at + 1:]


def official_path(variant: str, release: str = RELEASE) -> str:
    """The URL path of an archive in PyTorch's layout under a base's path ('+' spelled %2B, as PyTorch does)."""
    return f"/{variant}/libtorch-shared-with-deps-{release}%2B{variant}.zip"


def fdl_path(variant: str) -> str:
    return f"/libtorch-{variant}.zip"


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        path = unquote(self.path.split("?", 1)[0])
        self.server.seen.append(path)
        target = self.server.redirects.get(path)
        if target is not None:
            self.send_response(302)
            self.send_header("Location", target)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        data = self.server.files.get(path)
        if data is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if path in self.server.drop:
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
            return
        self.wfile.write(data)


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int]):
        super().__init__(address, _Handler)
        self.files: dict[str, bytes] = {}
        self.redirects: dict[str, str] = {}
        self.drop: set[str] = set()
        self.seen: list[str] = []


class LibtorchServer:
    """A real HTTP server on 127.0.0.1 (a free port); `files` maps unquoted URL paths to bytes."""

    def __init__(self, tls: ssl.SSLContext | None = None):
        self._server = _Server(("127.0.0.1", 0))
        if tls is not None:
            self._server.socket = tls.wrap_socket(self._server.socket, server_side=True)
        self.port = self._server.server_address[1]
        self.files, self.redirects, self.drop, self.seen = (self._server.files, self._server.redirects,
                                                            self._server.drop, self._server.seen)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def put(self, path: str, data: bytes) -> None:
        self.files[unquote(path)] = data

    def __enter__(self) -> LibtorchServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


# ---- the official location, over real TLS, through a CONNECT proxy ----

class _Proxy(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, upstream_port: int):
        super().__init__(("127.0.0.1", 0), _ProxyHandler)
        self.upstream_port = upstream_port
        self.connects: list[str] = []


class _ProxyHandler(socketserver.StreamRequestHandler):
    server: _Proxy

    def handle(self) -> None:
        request = self.rfile.readline(4096).decode("latin-1").split()
        while self.rfile.readline(4096) not in (b"\r\n", b"\n", b""):
            pass
        if len(request) < 2 or request[0] != "CONNECT":
            self.wfile.write(b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n")
            return
        self.server.connects.append(request[1])
        if request[1] != "download.pytorch.org:443":
            self.wfile.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
            return
        upstream = socket.create_connection(("127.0.0.1", self.server.upstream_port))
        self.wfile.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        self.wfile.flush()
        sockets = [self.connection, upstream]
        try:
            while True:
                ready, _, _ = select.select(sockets, [], [], 30)
                if not ready:
                    return
                for sock in ready:
                    data = sock.recv(65536)
                    if not data:
                        return
                    (upstream if sock is self.connection else self.connection).sendall(data)
        finally:
            upstream.close()


def _certificates(directory: Path) -> tuple[Path, Path, Path]:
    """A throwaway CA and a certificate for download.pytorch.org it signed: (ca.pem, cert.pem, key.pem)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fdl test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
          .not_valid_after(now + datetime.timedelta(days=2))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False),
                         critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "download.pytorch.org")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("download.pytorch.org")]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = directory / "ca.pem", directory / "cert.pem", directory / "key.pem"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return paths


class PyTorchOverTls:
    """download.pytorch.org as this test's own TLS server, reached through a CONNECT proxy on loopback.

    `server.put("/libtorch" + official_path("cpu"), data)` publishes an archive where PyTorch keeps it;
    `env` is what a client needs to go there (HTTPS_PROXY, REQUESTS_CA_BUNDLE, an empty NO_PROXY)."""

    def __init__(self, directory: Path):
        directory.mkdir(parents=True, exist_ok=True)
        ca, cert, key = _certificates(directory)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self.server = LibtorchServer(tls=context)
        self.proxy = _Proxy(self.server.port)
        self._proxy_thread = threading.Thread(target=self.proxy.serve_forever, daemon=True)
        self.env = {"HTTPS_PROXY": f"http://127.0.0.1:{self.proxy.server_address[1]}",
                    "https_proxy": f"http://127.0.0.1:{self.proxy.server_address[1]}",
                    "NO_PROXY": "", "no_proxy": "", "REQUESTS_CA_BUNDLE": str(ca), "CURL_CA_BUNDLE": ""}

    def __enter__(self) -> PyTorchOverTls:
        self.server.__enter__()
        self._proxy_thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.proxy.shutdown()
        self.proxy.server_close()
        self.server.__exit__(*exc)
