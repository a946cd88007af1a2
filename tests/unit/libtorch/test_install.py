"""libtorch acquisition from a mirror served by a real HTTP server on loopback."""

from __future__ import annotations

import functools
import hashlib
import http.server
import stat
import threading
import zipfile
from pathlib import Path

import pytest

from fdl.agent.gpu import Offer
from fdl.agent.libtorch import LibtorchFetchError, ensure_variant, route_auto
from fdl.config.schema import Devices
from fdl.errors import PermanentError
from tests.join_util import free_port


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # keep pytest output clean
        pass


@pytest.fixture
def mirror(tmp_path):
    """A directory served over HTTP on 127.0.0.1; yields (dir, base URL, request log)."""
    root = tmp_path / "mirror"
    root.mkdir()
    seen: list[str] = []

    class Handler(_Quiet):
        def do_GET(self):
            seen.append(self.path)
            super().do_GET()

    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), functools.partial(Handler,
                                                                                           directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield root, f"http://127.0.0.1:{server.server_address[1]}/libtorch", seen
    finally:
        server.shutdown()
        server.server_close()


def publish_archive(root: Path, variant: str, members: dict[str, bytes], *, checksum: str | None = None,
                    top: str = "libtorch/") -> str:
    folder = root / "libtorch"
    folder.mkdir(exist_ok=True)
    archive = folder / f"libtorch-{variant}.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for name, data in members.items():
            zf.writestr(top + name, data)
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    (folder / f"libtorch-{variant}.zip.sha256").write_text(f"{checksum or digest}  libtorch-{variant}.zip\n")
    return digest


LIBTORCH = {"lib/libtorch.so": b"\x7fELF fake", "include/torch/torch.h": b"// header", "build-version": b"2.10.0+cpu\n"}


def test_downloads_verifies_installs_and_activates(mirror, tmp_path):
    root, url, seen = mirror
    publish_archive(root, "cpu", LIBTORCH)
    env = {"HOME": str(tmp_path / "home")}
    notes = []
    got = ensure_variant("cpu", mirror=url, environ=env, note=notes.append)
    lt = tmp_path / "home" / ".flodl" / "libtorch"
    assert got.path == lt / "precompiled" / "cpu" and got.acquired and got.vendor is None
    assert (got.path / "lib" / "libtorch.so").read_bytes() == b"\x7fELF fake"
    assert (lt / ".active").read_text().strip() == "precompiled/cpu"
    assert stat.S_IMODE((lt / ".active").stat().st_mode) == 0o644
    assert not [p for p in lt.iterdir() if p.name.startswith("..active.")]  # its temp file renamed, none left
    assert [p for p in seen] == ["/libtorch/libtorch-cpu.zip.sha256", "/libtorch/libtorch-cpu.zip"]
    assert not [p for p in (lt / "precompiled").iterdir() if p.name.startswith(".")]  # no temp left behind
    again = ensure_variant("cpu", mirror=url, environ=env, note=notes.append)
    assert not again.acquired and len(seen) == 2  # present: nothing downloaded


def test_a_checksum_mismatch_installs_nothing_and_is_transient(mirror, tmp_path):
    root, url, _ = mirror
    publish_archive(root, "cu128", LIBTORCH, checksum="0" * 64)
    env = {"HOME": str(tmp_path / "home")}
    with pytest.raises(LibtorchFetchError) as err:
        ensure_variant("cu128", mirror=url, environ=env)
    assert err.value.exit_code == 1 and "failed its checksum" in err.value.message
    base = tmp_path / "home" / ".flodl" / "libtorch" / "precompiled"
    assert list(base.iterdir()) == []  # neither the variant nor a partial file


def test_a_missing_archive_is_transient(mirror, tmp_path):
    _, url, _ = mirror
    with pytest.raises(LibtorchFetchError) as err:
        ensure_variant("rocm7.1", mirror=url, environ={"HOME": str(tmp_path)})
    assert err.value.exit_code == 1 and "HTTP 404" in err.value.message


def test_no_mirror_for_a_missing_variant_is_permanent(tmp_path):
    with pytest.raises(PermanentError) as err:
        ensure_variant("cu126", mirror=None, environ={"HOME": str(tmp_path)})
    assert err.value.exit_code == 2 and "FDL_LIBTORCH_MIRROR" in err.value.hint


def test_an_archive_escaping_its_directory_is_refused(mirror, tmp_path):
    root, url, _ = mirror
    publish_archive(root, "cpu", {"lib/libtorch.so": b"x", "../../evil": b"owned"}, top="")
    with pytest.raises(LibtorchFetchError, match="unsafe path"):
        ensure_variant("cpu", mirror=url, environ={"HOME": str(tmp_path / "h")})
    assert not (tmp_path / "h" / ".flodl" / "evil").exists()
    assert not (tmp_path / "h" / ".flodl" / "libtorch" / "precompiled" / "cpu").exists()


def test_an_archive_without_lib_is_refused(mirror, tmp_path):
    root, url, _ = mirror
    publish_archive(root, "cpu", {"README": b"not libtorch"})
    with pytest.raises(LibtorchFetchError, match="no lib/"):
        ensure_variant("cpu", mirror=url, environ={"HOME": str(tmp_path)})


@pytest.mark.parametrize("offer, variant", [
    (Offer(devices=Devices(kind="cpu", count=2)), "cpu"),
    (Offer(devices=Devices(ids=(0,)), vendor="nvidia", capabilities=((9, 0),)), "cu128"),
    (Offer(devices=Devices(ids=(0,)), vendor="nvidia", capabilities=((12, 0),)), "cu128"),
    (Offer(devices=Devices(ids=(0, 1)), vendor="nvidia", capabilities=((6, 1), (8, 6))), "cu126"),
    (Offer(devices=Devices(ids=(0,)), vendor="amd", gpu_names=("gfx90a",)), "rocm7.1"),
])
def test_auto_routes_on_this_boxs_devices(offer, variant):
    assert route_auto(offer) == variant


def test_auto_refuses_a_box_no_single_build_serves():
    offer = Offer(devices=Devices(ids=(0, 1)), vendor="nvidia", capabilities=((6, 1), (12, 0)))
    with pytest.raises(PermanentError, match="no precompiled libtorch serves"):
        route_auto(offer)
