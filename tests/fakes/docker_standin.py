"""A stand-in for the `docker` client, for tests on machines without a Docker engine.

Installed as an executable named `docker` on PATH by the tests. It records every
invocation (argv, one JSON line each) in $FAKE_DOCKER_LOG and imitates the few
commands the fdl_nccl role runs:

  docker --version / docker info --format ...   client and daemon checks
  docker build --tag T --file F CTX             reads the NCCL version from F's labels
  docker create T                               prints a container id
  docker cp ID:/opt/nccl/build/lib DEST         writes libnccl.so.2.X.Y (+ links) into DEST
  docker rm ID

Knobs: FAKE_DOCKER_DAEMON=down (daemon unreachable), FAKE_DOCKER_BUILD_FAIL=1 (the
image build fails like a bad make), FAKE_DOCKER_LIB_VERSION=X.Y.Z (the image holds
a different NCCL than the Dockerfile asked for). State lives in $FAKE_DOCKER_STATE.
"""

import json
import os
import re
import secrets
import sys
from pathlib import Path


def state_path() -> Path:
    return Path(os.environ["FAKE_DOCKER_STATE"])


def load() -> dict:
    path = state_path()
    return json.loads(path.read_text()) if path.exists() else {"images": {}, "containers": {}}


def save(state: dict) -> None:
    state_path().write_text(json.dumps(state))


def option(args: list, name: str) -> str:
    return args[args.index(name) + 1]


def main(args: list) -> int:
    with open(os.environ["FAKE_DOCKER_LOG"], "a", encoding="utf-8") as log:
        log.write(json.dumps(args) + "\n")
    if args == ["--version"]:
        print("Docker version 28.2.2, build stand-in")
        return 0
    command = args[0] if args else ""
    if command == "info":
        if os.environ.get("FAKE_DOCKER_DAEMON") == "down":
            print("Cannot connect to the Docker daemon at unix:///var/run/docker.sock. "
                  "Is the docker daemon running?", file=sys.stderr)
            return 1
        print("28.2.2")
        return 0
    state = load()
    if command == "build":
        dockerfile = Path(option(args, "--file"))
        text = dockerfile.read_text()
        version = re.search(r'org\.flodl\.nccl\.version="([0-9.]+)"', text).group(1)
        print(f"#1 [internal] load build definition from {dockerfile.name}")
        print("#7 [5/6] RUN make -j src.build NVCC_GENCODE=...")
        if os.environ.get("FAKE_DOCKER_BUILD_FAIL") == "1":
            print("nvcc fatal   : Unsupported gpu architecture 'compute_999'", file=sys.stderr)
            print("ERROR: failed to solve: process did not complete successfully: exit code: 2", file=sys.stderr)
            return 1
        state["images"][option(args, "--tag")] = os.environ.get("FAKE_DOCKER_LIB_VERSION", version)
        save(state)
        print("#9 DONE 0.0s")
        return 0
    if command == "create":
        image = args[1]
        if image not in state["images"]:
            print(f"Unable to find image '{image}' locally", file=sys.stderr)
            return 1
        container = secrets.token_hex(32)
        state["containers"][container] = image
        save(state)
        print(container)
        return 0
    if command == "cp":
        source, dest = args[1], Path(args[2])
        container, _, inside = source.partition(":")
        if container not in state["containers"] or inside != "/opt/nccl/build/lib":
            print(f"Error response from daemon: Could not find the file {inside} in container", file=sys.stderr)
            return 1
        if not dest.parent.is_dir():
            print(f"invalid output path: directory {dest.parent} does not exist", file=sys.stderr)
            return 1
        version = state["images"][state["containers"][container]]
        dest.mkdir()
        (dest / f"libnccl.so.{version}").write_bytes(b"\x7fELF stand-in libnccl " + version.encode())
        (dest / "libnccl.so.2").symlink_to(f"libnccl.so.{version}")
        (dest / "libnccl.so").symlink_to("libnccl.so.2")
        (dest / "libnccl_static.a").write_bytes(b"!<arch>\n")
        return 0
    if command == "rm":
        state["containers"].pop(args[1], None)
        save(state)
        print(args[1])
        return 0
    print(f"docker stand-in: unsupported command {args!r}", file=sys.stderr)
    return 125


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
