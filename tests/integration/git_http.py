"""A git smart-HTTP server on loopback that demands basic authentication: git's own `git http-backend` (CGI)
behind Python's http.server, on a port the kernel picks. It records every Authorization it was sent."""

from __future__ import annotations

import base64
import os
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


class GitHttpServer:
    def __init__(self, root: Path, username: str, password: str):
        self.root, self.username, self.password = root, username, password
        self.seen: list[str | None] = []  # the decoded user:password of each request (None: none sent)
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:  # keep the test output quiet
                pass

            def do_GET(self) -> None:
                self._serve(b"")

            def do_POST(self) -> None:
                self._serve(self._body())

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    out = b""
                    while True:
                        size = int(self.rfile.readline().strip().split(b";")[0], 16)
                        chunk = self.rfile.read(size)
                        self.rfile.readline()
                        if size == 0:
                            return out
                        out += chunk
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _serve(self, body: bytes) -> None:
                auth = self.headers.get("Authorization")
                given = base64.b64decode(auth.split(" ", 1)[1]).decode() if auth and auth.startswith("Basic ") \
                    else None
                server.seen.append(given)
                if given != f"{server.username}:{server.password}":
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", 'Basic realm="fdl-test"')
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                path, _, query = self.path.partition("?")
                env = {"PATH": os.environ["PATH"], "GIT_PROJECT_ROOT": str(server.root), "GIT_HTTP_EXPORT_ALL": "1",
                       "PATH_INFO": path, "QUERY_STRING": query, "REQUEST_METHOD": self.command,
                       "CONTENT_TYPE": self.headers.get("Content-Type", ""), "CONTENT_LENGTH": str(len(body)),
                       "REMOTE_USER": server.username, "REMOTE_ADDR": "127.0.0.1",
                       "GIT_PROTOCOL": self.headers.get("Git-Protocol", ""),
                       "HTTP_CONTENT_ENCODING": self.headers.get("Content-Encoding", ""),
                       "GIT_CONFIG_NOSYSTEM": "1", "HOME": str(server.root)}
                done = subprocess.run(["git", "http-backend"], input=body, capture_output=True, env=env, timeout=60)
                head, _, payload = done.stdout.partition(b"\r\n\r\n")
                status = 200
                headers = []
                for line in head.split(b"\r\n"):
                    name, _, value = line.decode().partition(":")
                    if name.lower() == "status":
                        status = int(value.strip().split()[0])
                    elif name:
                        headers.append((name, value.strip()))
                self.send_response(status)
                for name, value in headers:
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def start(self) -> GitHttpServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)
