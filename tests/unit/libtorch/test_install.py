"""Downloading libtorch from real HTTP(S) servers on loopback: PyTorch's layout (over real TLS, through a
proxy, as download.pytorch.org) and a mirror's, every verification step, and nothing left behind."""

from __future__ import annotations

import hashlib
import re
import stat
import threading
import zipfile
from pathlib import Path

import pytest

from fdl.errors import UsageError
from fdl.hostside.checks.devices import Devices
from fdl.hostside.libtorch.resolve import describe_variant, read_key_values
from fdl.libtorch.install import LibtorchFetchError, ensure_variant
from fdl.libtorch.source import Source, choose_source, official_url, route_auto
from fdl.offer import Offer
from tests.fakes.libtorch_server import (
    LibtorchServer,
    PyTorchOverTls,
    corrupt_crc,
    fake_archive,
    fdl_path,
    official_path,
)


@pytest.fixture
def server():
    with LibtorchServer() as srv:
        yield srv


def mirror(srv: LibtorchServer, *pins: tuple[str, str]) -> Source:
    return Source(srv.url + "/libtorch", "--mirror", tuple(pins))


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def nothing_left(home: Path) -> bool:
    """The home is as empty as before the attempt: no ~/.flodl, no lock, no temp file, no empty directory."""
    return not home.exists() or list(home.iterdir()) == []


def test_the_default_source_is_pytorchs_own_location_over_https(tmp_path, monkeypatch):
    """No configuration: the pinned release from download.pytorch.org, in PyTorch's naming, over TLS."""
    assert choose_source(None, {}) == Source()
    assert official_url("cu130") == \
        "https://download.pytorch.org/libtorch/cu130/libtorch-shared-with-deps-2.13.0%2Bcu130.zip"
    archive = fake_archive("cpu")
    with PyTorchOverTls(tmp_path / "tls") as pytorch:
        pytorch.server.put("/libtorch" + official_path("cpu"), archive)
        for name, value in pytorch.env.items():
            monkeypatch.setenv(name, value)
        home = tmp_path / "home"
        notes: list[str] = []
        got = ensure_variant("cpu", source=Source(), environ={"HOME": str(home)}, note=notes.append)
    assert pytorch.proxy.connects == ["download.pytorch.org:443"]
    assert pytorch.server.seen == ["/libtorch/cpu/libtorch-shared-with-deps-2.13.0+cpu.zip"]
    lt = home / ".flodl" / "libtorch"
    assert got.acquired and got.libtorch.path == str(lt / "precompiled" / "cpu")
    assert (got.libtorch.version, got.libtorch.variant, got.libtorch.sha256) == ("2.13.0", "cpu", sha(archive))
    record = read_key_values(lt / "precompiled" / "cpu" / ".fdl-download")
    assert record == {"url": official_url("cpu"), "sha256": sha(archive), "bytes": str(len(archive)),
                      "build": "2.13.0+cpu", "pinned_by": "nothing"}
    assert (lt / ".active").read_text() == "precompiled/cpu\n"
    assert sorted(p.name for p in lt.iterdir()) == [".active", "precompiled"]  # no .lock left
    assert [p.name for p in (lt / "precompiled").iterdir()] == ["cpu"]
    assert any(f"sha256 {sha(archive)}" in note for note in notes)


def test_pytorchs_location_never_leaves_https(tmp_path, monkeypatch):
    with PyTorchOverTls(tmp_path / "tls") as pytorch, LibtorchServer() as plain:
        plain.put(official_path("cpu"), fake_archive("cpu"))
        pytorch.server.redirects["/libtorch" + official_path("cpu").replace("%2B", "+")] = \
            plain.url + official_path("cpu")
        for name, value in pytorch.env.items():
            monkeypatch.setenv(name, value)
        with pytest.raises(LibtorchFetchError, match="which is not HTTPS"):
            ensure_variant("cpu", source=Source(), environ={"HOME": str(tmp_path / "home")})
    assert plain.seen == []  # refused before anything was sent there
    assert nothing_left(tmp_path / "home")


def test_a_variant_the_pinned_release_does_not_publish_needs_a_mirror(tmp_path):
    with pytest.raises(UsageError, match=r"PyTorch 2\.13\.0 publishes no cu128 libtorch") as err:
        ensure_variant("cu128", source=Source(), environ={"HOME": str(tmp_path / "home")})
    assert "mirror" in err.value.hint
    assert nothing_left(tmp_path / "home")


def test_a_mirror_in_pytorchs_layout(server, tmp_path):
    archive = fake_archive("cu130")
    server.put("/libtorch" + official_path("cu130"), archive)
    got = ensure_variant("cu130", source=mirror(server), environ={"HOME": str(tmp_path / "home")})
    assert got.libtorch.sha256 == sha(archive) and got.libtorch.kind == "cuda" and got.libtorch.cuda == "13.0"
    # fdl's naming is asked for first (its checksum), then PyTorch's, with its optional checksum
    assert server.seen == ["/libtorch/libtorch-cu130.zip.sha256", "/libtorch/cu130/libtorch-shared-with-deps-"
                           "2.13.0+cu130.zip.sha256", "/libtorch/cu130/libtorch-shared-with-deps-2.13.0+cu130.zip"]


def test_a_mirror_in_fdls_layout_checks_its_sha256(server, tmp_path):
    archive = fake_archive("rocm7.1", "2.9.1")  # fdl's naming: any release, the variant must match
    server.put("/libtorch" + fdl_path("rocm7.1"), archive)
    server.put("/libtorch" + fdl_path("rocm7.1") + ".sha256", f"{sha(archive)}  libtorch-rocm7.1.zip\n".encode())
    got = ensure_variant("rocm7.1", source=mirror(server), environ={"HOME": str(tmp_path / "home")})
    assert got.libtorch.path.endswith("precompiled/rocm71") and got.libtorch.vendor == "amd"
    record = read_key_values(Path(got.libtorch.path) / ".fdl-download")
    assert (record["pinned_by"], record["build"]) == ("the mirror's .sha256", "2.9.1+rocm7.1")
    again = ensure_variant("rocm7.1", source=mirror(server), environ={"HOME": str(tmp_path / "home")})
    assert not again.acquired and len(server.seen) == 2  # present: nothing fetched


def test_a_mirror_checksum_mismatch_installs_nothing(server, tmp_path):
    archive = fake_archive("cpu")
    server.put("/libtorch" + fdl_path("cpu"), archive)
    server.put("/libtorch" + fdl_path("cpu") + ".sha256", b"0" * 64 + b"\n")
    with pytest.raises(LibtorchFetchError) as err:
        ensure_variant("cpu", source=mirror(server), environ={"HOME": str(tmp_path / "home")})
    assert err.value.exit_code == 1 and "failed its checksum" in err.value.message
    assert "the mirror's .sha256 says " + "0" * 64 in err.value.message
    assert nothing_left(tmp_path / "home")


def test_a_wrong_pin_installs_nothing(server, tmp_path):
    server.put("/libtorch" + official_path("cpu"), fake_archive("cpu"))
    with pytest.raises(LibtorchFetchError, match="libtorch.sha256 says " + "a" * 64):
        ensure_variant("cpu", source=mirror(server, ("cpu", "a" * 64)), environ={"HOME": str(tmp_path / "home")})
    assert nothing_left(tmp_path / "home")


def test_the_right_pin_is_recorded_and_an_installed_variant_must_match_it(server, tmp_path):
    archive = fake_archive("cpu")
    server.put("/libtorch" + official_path("cpu"), archive)
    env = {"HOME": str(tmp_path / "home")}
    got = ensure_variant("cpu", source=mirror(server, ("cpu", sha(archive))), environ=env)
    assert read_key_values(Path(got.libtorch.path) / ".fdl-download")["pinned_by"] == "libtorch.sha256"
    ensure_variant("cpu", source=mirror(server, ("cpu", sha(archive))), environ=env)  # the same bytes: fine
    with pytest.raises(LibtorchFetchError, match=f"was installed from bytes with sha256 {sha(archive)}, but "
                                                 f"libtorch.sha256 pins {'b' * 64}") as err:
        ensure_variant("cpu", source=mirror(server, ("cpu", "b" * 64)), environ=env)
    assert err.value.exit_code == 1  # fdl join decides before its first dial that its own pin is permanent


def test_a_pin_and_a_mirror_checksum_that_disagree_fetch_nothing(server, tmp_path):
    archive = fake_archive("cpu")
    server.put("/libtorch" + fdl_path("cpu"), archive)
    server.put("/libtorch" + fdl_path("cpu") + ".sha256", sha(archive).encode())
    with pytest.raises(LibtorchFetchError, match="nothing was downloaded"):
        ensure_variant("cpu", source=mirror(server, ("cpu", "c" * 64)), environ={"HOME": str(tmp_path / "home")})
    assert "/libtorch/libtorch-cpu.zip" not in server.seen
    assert nothing_left(tmp_path / "home")


def test_a_corrupted_archive_is_refused_before_anything_is_unpacked(server, tmp_path):
    archive = corrupt_crc(fake_archive("cpu"))
    with zipfile.ZipFile(__import__("io").BytesIO(archive)) as zf:
        assert zf.testzip() == "libtorch/lib/libtorch.so"  # the fake really is corrupt where we say
    server.put("/libtorch" + official_path("cpu"), archive)
    with pytest.raises(LibtorchFetchError, match=re.escape("'libtorch/lib/libtorch.so' fails its CRC check")):
        ensure_variant("cpu", source=mirror(server), environ={"HOME": str(tmp_path / "home")})
    assert nothing_left(tmp_path / "home")


def test_a_connection_dropped_mid_download_installs_nothing(server, tmp_path):
    archive = fake_archive("cpu", extra={"lib/libc10.so": bytes(range(256)) * 64})
    server.put("/libtorch" + official_path("cpu"), archive)
    server.drop.add("/libtorch" + official_path("cpu").replace("%2B", "+"))
    with pytest.raises(LibtorchFetchError, match="broke off") as err:
        ensure_variant("cpu", source=mirror(server), environ={"HOME": str(tmp_path / "home")})
    assert "Nothing was installed" in err.value.message and err.value.exit_code == 1
    assert nothing_left(tmp_path / "home")


def test_old_leftovers_are_cleaned_by_the_next_attempt(server, tmp_path):
    """An older fdl's failed download left a .lock, an install killed outright its temporary files: the next
    attempt, failing too, takes them away."""
    lt = tmp_path / "home" / ".flodl" / "libtorch"
    (lt / "precompiled" / ".cpu.k1ll3d.tmp" / "lib").mkdir(parents=True)  # an install killed outright
    (lt / "precompiled" / ".cpu.k1ll3d.zip.part").write_bytes(b"PK")
    (lt / ".active.x1.fdl-tmp").write_text("precompiled/cpu\n")
    (lt / ".lock").write_text("")
    with pytest.raises(LibtorchFetchError, match="HTTP 404"):
        ensure_variant("cpu", source=mirror(server), environ={"HOME": str(tmp_path / "home")})
    assert not lt.exists() and (tmp_path / "home" / ".flodl").is_dir()  # ~/.flodl was not this attempt's


@pytest.mark.parametrize("archive, message", [
    (fake_archive("cu130"), "holds libtorch '2.13.0+cu130', not the 2.13.0+cpu asked for"),
    (fake_archive("cpu", "2.12.1"), "holds libtorch '2.12.1+cpu', not the 2.13.0+cpu asked for"),
    (fake_archive("cpu", build_version=False), "has no libtorch/build-version"),
    (fake_archive("cpu", top="", extra={"../../evil": b"owned"}), "unsafe path"),
    (b"this is not a zip at all", "not a readable zip archive"),
])
def test_an_archive_that_is_not_what_was_asked_for_is_refused(server, tmp_path, archive, message):
    server.put("/libtorch" + official_path("cpu"), archive)
    with pytest.raises(LibtorchFetchError, match=re.escape(message)):
        ensure_variant("cpu", source=mirror(server), environ={"HOME": str(tmp_path / "home")})
    assert nothing_left(tmp_path / "home")
    assert not (tmp_path / "evil").exists()


def test_an_archive_without_lib_or_with_an_escaping_link_is_refused(server, tmp_path):
    import io

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("libtorch/lib/libtorch.so", b"x")
        zf.writestr("libtorch/build-version", "2.13.0+cpu\n")
        link = zipfile.ZipInfo("libtorch/lib/escape")
        link.external_attr = (stat.S_IFLNK | 0o777) << 16
        zf.writestr(link, "../../../../etc")
    server.put("/libtorch" + official_path("cpu"), buf.getvalue())
    with pytest.raises(LibtorchFetchError, match="a link leaving the archive"):
        ensure_variant("cpu", source=mirror(server), environ={"HOME": str(tmp_path / "home")})
    server.put("/libtorch" + official_path("cpu"), fake_archive("cpu", top="libtorch/").replace(b"lib/", b"lob/"))
    with pytest.raises(LibtorchFetchError, match="no lib/ directory"):
        ensure_variant("cpu", source=mirror(server), environ={"HOME": str(tmp_path / "home")})
    assert nothing_left(tmp_path / "home")


def test_two_installs_at_once_share_one_download(server, tmp_path):
    archive = fake_archive("cpu")
    server.put("/libtorch" + official_path("cpu"), archive)
    env = {"HOME": str(tmp_path / "home")}
    results: list[bool] = []
    errors: list[BaseException] = []

    def install() -> None:
        try:
            results.append(ensure_variant("cpu", source=mirror(server), environ=env).acquired)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=install) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == [] and sorted(results) == [False, False, False, True]
    lt = tmp_path / "home" / ".flodl" / "libtorch"
    assert sorted(p.name for p in lt.iterdir()) == [".active", "precompiled"]
    assert describe_variant(lt / "precompiled" / "cpu", "home").sha256 == sha(archive)


@pytest.mark.parametrize("offer, variant", [
    (Offer(devices=Devices(kind="cpu", count=2)), "cpu"),
    (Offer(devices=Devices(ids=(0,)), vendor="nvidia", capabilities=((9, 0),)), "cu130"),
    (Offer(devices=Devices(ids=(0,)), vendor="nvidia", capabilities=((12, 0),)), "cu130"),
    (Offer(devices=Devices(ids=(0, 1)), vendor="nvidia", capabilities=((6, 1), (8, 6))), "cu126"),
    (Offer(devices=Devices(ids=(0,)), vendor="nvidia", capabilities=((7, 0),)), "cu126"),
    (Offer(devices=Devices(ids=(0,)), vendor="amd", gpu_names=("gfx90a",)), "rocm7.2"),
])
def test_auto_routes_on_this_boxs_devices(offer, variant):
    assert route_auto(offer.vendor, offer.capabilities) == variant


def test_auto_refuses_a_box_no_single_build_serves():
    with pytest.raises(UsageError, match="no precompiled libtorch serves"):
        route_auto("nvidia", ((6, 1), (12, 0)))


@pytest.mark.parametrize("left", ["an empty directory", "a tree without lib/"])
def test_a_half_made_variant_directory_is_replaced_whole(server, tmp_path, left):
    """regression: a variant directory without lib/ counts as not installed, yet the rename onto it failed
    (`cannot move libtorch into ...`) when it held anything; fdl's directory installer exchanges it instead."""
    archive = fake_archive("cu130")
    server.put("/libtorch" + official_path("cu130"), archive)
    target = tmp_path / "home" / ".flodl" / "libtorch" / "precompiled" / "cu130"
    target.mkdir(parents=True)
    if left != "an empty directory":
        (target / "include").mkdir()
        (target / "include" / "torch.h").write_text("half")
    got = ensure_variant("cu130", source=mirror(server), environ={"HOME": str(tmp_path / "home")})
    assert got.acquired and got.libtorch.path == str(target) and (target / "lib").is_dir()
    assert not (target / "include" / "torch.h").exists()
    assert [p.name for p in target.parent.iterdir()] == ["cu130"]  # nothing hidden left beside it
