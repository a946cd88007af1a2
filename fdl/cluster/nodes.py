"""Hosts behind execution nodes: their playbooks run on the node, shipped with ansible-runner's remote job execution.

A worker (or node) that names `via: NODE` in the cluster file is driven from that node, the way AWX drives
Receptor's execution nodes: the job's private data directory is built here as for any run (the inventory of
that node's hosts, the extra variables, the pinned ansible.cfg and the flodl.fdl collection under `project/`),
ansible-runner's `transmit` streams it into `ssh NODE ansible-runner worker`, the node runs stock
ansible-playbook against its hosts, and the event stream that comes back is fed to ansible-runner's `process`,
whose events go to the run's one `Collector` (fdl.cluster.events). So a host reached through a node gives the
same events and HostResult as a direct one, and fdl never grows a job protocol of its own.

    direct, by_node = split(inventory, hosts)    # {node name: [hosts it drives]}

One command's nodes run at once, each in threads of its own, beside the direct part (fdl.cluster.runner runs
it). A node that cannot run the job, or dies while it runs, marks the hosts it had not answered for
`unreachable` with the reason ("unreachable through n1: ..."), in bounded time: ssh notices a dead link
within about 10 seconds (ansible.cfg's ServerAlive settings), the node's worker sends a keepalive every
KEEPALIVE_S seconds of quiet, and a stream silent for IDLE_LIMIT_S is taken for a hung node. The rest of the
run stands.

The node needs the ansible-core and ansible-runner fdl runs with, in the virtualenv NODE_VENV that the
flodl.fdl.execution_node playbook makes (roles/fdl_execution_node); nothing else, and no fdl.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import time
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import IO, Any

from fdl.cluster.connection import ansible_environment
from fdl.cluster.events import OK, PENDING, RUNNING, SKIPPED, UNREACHABLE, Collector
from fdl.cluster.inventory import ClusterInventory, InventoryHost
from fdl.cluster.ssh import NODE_CONTROL_PATH_DIR, node_ssh_argv
from fdl.collection import RELATIVE
from fdl.hostside.fsio import atomic_write
from fdl.hostside.paths import NODE_VENV_IN_HOME
from fdl.hostside.supervisor import signal_processes
from fdl.resources import ansible_cfg, collections_path

NODE_VENV = NODE_VENV_IN_HOME  # where flodl.fdl.execution_node installs ansible-core and ansible-runner
PREPARE_PLAYBOOK = "execution_node.yml"
KEEPALIVE_S = 2  # the node's worker says it is alive after this many seconds without output
IDLE_LIMIT_S = 30.0  # a stream with nothing in it (keepalives included) this long: the node is taken for hung
EXIT_GRACE_S = 10.0  # after its stream ends, how long ssh gets to exit before it is killed
TIMEOUT_GRACE_S = 15.0  # past the run's timeout (which the node enforces itself), the controller cuts the stream
SHIP_DIR = "fdl-ship"  # beside the job's playbook: files it reads on the node (run_playbook's ship=)
_STDERR_LINES = 20
_OUTPUT_LINES = 40
_ENDED = ("successful", "failed", "timeout", "canceled")  # ansible-runner's final statuses
PEXPECT_TIMEOUT = 0.2


def split(inventory: ClusterInventory, hosts: Sequence[str]) -> tuple[list[str], dict[str, list[str]]]:
    """`hosts` in two: the ones this machine drives, and {execution node: the hosts it drives}, in host order."""
    direct: list[str] = []
    by_node: dict[str, list[str]] = {}
    for name in hosts:
        node = inventory.hosts[name].via
        if node is None:
            direct.append(name)
        else:
            by_node.setdefault(node.name, []).append(name)
    return direct, by_node


def node_host(inventory: ClusterInventory, name: str) -> InventoryHost:
    """The inventory host of an execution node a host of `inventory` names in via:."""
    for host in inventory.hosts.values():
        if host.via is not None and host.via.name == name:
            return host.via
    raise KeyError(name)


def node_environment(forks: int) -> dict[str, str]:
    """The environment ansible-playbook runs in on a node: fdl's own pinned settings, with its paths made relative
    to the job's project directory (where the node's ansible-runner starts it) and the node's ControlPath
    directory; PATH is the node's (the worker command puts the virtualenv first)."""
    env = ansible_environment(forks)
    env.pop("PATH", None)
    env.update({
        "ANSIBLE_CONFIG": "ansible.cfg",
        "ANSIBLE_COLLECTIONS_PATH": "collections",
        "ANSIBLE_MODULE_UTILS": str(Path("collections") / RELATIVE / "plugins" / "module_utils"),
        "ANSIBLE_SSH_CONTROL_PATH_DIR": NODE_CONTROL_PATH_DIR,
    })
    return env


def worker_command(keepalive_s: int = KEEPALIVE_S) -> str:
    """What ssh runs on the node: ansible-runner's worker from the node's virtualenv, its bin first on PATH (the
    worker starts ansible-playbook from there)."""
    venv = NODE_VENV.replace("~", "$HOME", 1)
    return (f'PATH="{venv}/bin:$PATH" exec "{venv}/bin/ansible-runner" worker '
            f"--keepalive-seconds {int(keepalive_s)}")


# --------------------------------------------------------------------------- the job's private data directory


def _link_tree(src: Path, dst: Path) -> None:
    """A copy of the tree src at dst, by hard links where the file system allows (the stream reads the files)."""
    for directory, _dirs, files in os.walk(src):
        rel = Path(directory).relative_to(src)
        (dst / rel).mkdir(parents=True, exist_ok=True)
        for name in files:
            _link_file(Path(directory) / name, dst / rel / name)


def _link_file(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:  # another file system, or links refused: a copy
        shutil.copy2(src, dst)


def job_dir(pdd: Path, run_id: str, inventory_json: str, variables_json: str, playbook: Path,
            ship: dict[str, Path] | None) -> tuple[Path, str]:
    """Lay out the directory transmit streams to a node (under pdd, private, removed after the run): project/ with
    ansible.cfg, the collection and the playbook, inventory/hosts.json, env/extravars (0600), and the shipped
    files, under the playbook's directory (Ansible runs a local task's command there, so their relative paths name
    them). Returns the directory and the playbook's path inside project/."""
    root = pdd / f"stream-{run_id}"
    project = root / "project"
    project.mkdir(parents=True, mode=0o700)
    os.chmod(root, 0o700)
    _link_file(ansible_cfg(), project / "ansible.cfg")
    collections = collections_path()
    _link_tree(collections / RELATIVE, project / "collections" / RELATIVE)
    try:
        rel_playbook = str(Path("collections") / RELATIVE / playbook.resolve().relative_to(
            (collections / RELATIVE).resolve()))
    except ValueError:  # a playbook of the caller's own: it goes along, at the top of project/
        _link_file(playbook, project / playbook.name)
        rel_playbook = playbook.name
    for rel, source in (ship or {}).items():  # beside the playbook: a local task's commands run in its directory
        _link_file(Path(source), (project / rel_playbook).parent / rel)
    (root / "inventory").mkdir(mode=0o700)
    atomic_write(root / "inventory" / "hosts.json", inventory_json, mode=0o600)
    (root / "env").mkdir(mode=0o700)
    atomic_write(root / "env" / "extravars", variables_json, mode=0o600)
    return root, rel_playbook


# --------------------------------------------------------------------------- one node's part of a run


class _Watched:
    """The stream from a node, with the time anything last arrived in it (keepalives included). Read-only; it has
    the file methods ansible-runner's stream decoder asks for."""

    name = "<fdl node stream>"

    def __init__(self, raw: IO[bytes]):
        self.raw = raw
        self.last = time.monotonic()
        self.received = False

    @property
    def closed(self) -> bool:
        return self.raw.closed

    def close(self) -> None:
        self.raw.close()

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return False

    def write(self, data: bytes) -> int:
        raise OSError("the stream from an execution node is read-only")

    def readline(self, *args: Any) -> bytes:
        line = self.raw.readline(*args)
        self.last = time.monotonic()
        self.received = self.received or bool(line)
        return line

    def read(self, *args: Any) -> bytes:
        data = self.raw.read(*args)
        self.last = time.monotonic()
        return data

    def flush(self) -> None:
        pass


@dataclass
class NodeRun:
    """One node's part of a run: its status and rc (as ansible-runner on the node reported them), and why it failed
    to deliver a result when it did (then its hosts without one are unreachable through it)."""

    node: str
    hosts: list[str]
    status: str = "unstarted"
    rc: int = -1
    problem: str | None = None
    received: bool = False  # the node's worker answered (anything, keepalives included)
    artifact_dir: Path | None = None
    stderr: list[str] = field(default_factory=list)
    output: list[str] = field(default_factory=list)  # the last lines ansible-playbook printed on the node, outside
    # its events (its errors and warnings): quoted in a problem, never parsed
    ended: str | None = None  # the final status the node's own ansible-runner sent (successful, failed, ...), if any
    unsent: str | None = None  # why fdl could not send the job, when it could not


def run_on_node(node: str, argv: list[str], job: Path, rel_playbook: str, pdd: Path, run_id: str,
                hosts: list[str], collector: Collector, cancel: Callable[[], bool], timeout: float | None,
                forks: int) -> NodeRun:
    """Stream the job in `job` to `argv` (ssh to the node, running ansible-runner's worker), process what comes back
    into `collector`, and settle every host of `hosts` the node did not answer for. Never raises for the node's
    sake: a node that fails is this part's result."""
    import ansible_runner

    out = NodeRun(node=node, hosts=list(hosts))
    seen_stats = threading.Event()
    final: dict[str, Any] = {}

    def on_event(event: dict[str, Any]) -> bool:
        kind = event.get("event")
        if kind == "playbook_on_stats":
            seen_stats.set()
        elif kind in ("verbose", "error"):  # what ansible-playbook printed outside its callback's events
            out.output.extend(line.rstrip() for line in str(event.get("stdout") or "").splitlines() if line.strip())
            del out.output[:-_OUTPUT_LINES]
        return collector(event)

    def on_status(data: dict[str, Any], runner_config: Any = None) -> None:
        final.update(data)
        if data.get("runner_ident") is not None and data.get("status") in _ENDED:
            out.ended = str(data["status"])  # sent by the node's ansible-runner once its ansible-playbook exited

    try:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
    except OSError as exc:
        out.problem = f"cannot run ssh to it: {exc.strerror or exc}"
        _settle(out, collector, seen_stats)
        return out
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    stream = _Watched(proc.stdout)
    stopped: list[str] = []  # why fdl cut the stream: "canceled", "timeout" or "idle"
    done = threading.Event()

    def send() -> None:
        try:
            ansible_runner.run(
                private_data_dir=str(job), ident=run_id, playbook=str(job / "project" / rel_playbook),
                inventory=str(job / "inventory" / "hosts.json"), envvars=node_environment(forks), forks=forks,
                quiet=True, suppress_env_files=True, timeout=int(timeout) if timeout else None,
                settings={"pexpect_timeout": PEXPECT_TIMEOUT, "suppress_ansible_output": True},
                streamer="transmit", _output=proc.stdin)
        except OSError:  # the node went away while the job was sent: the reader says why
            pass
        except Exception as exc:  # this thread's end: said as the node's failure, and its worker, which would wait
            out.unsent = f"{type(exc).__name__}: {exc}"  # for the rest of the job, is cut off
            _kill(proc)
        finally:
            try:
                proc.stdin.close()  # type: ignore[union-attr]
            except OSError:
                pass

    def read_stderr() -> None:
        for raw in iter(proc.stderr.readline, b""):  # type: ignore[union-attr]
            line = raw.decode("utf-8", "replace").strip()
            if line:
                out.stderr.append(line)
                del out.stderr[:-_STDERR_LINES]

    def watch() -> None:
        deadline = None if not timeout else time.monotonic() + timeout + TIMEOUT_GRACE_S
        while not done.wait(0.2):
            reason = None
            if cancel():
                reason = "canceled"
            elif deadline is not None and time.monotonic() > deadline:
                reason = "timeout"
            elif time.monotonic() - stream.last > IDLE_LIMIT_S:
                reason = "idle"
            if reason is not None:
                stopped.append(reason)
                _kill(proc)
                return

    helpers = [threading.Thread(target=f, name=f"fdl-node-{node}-{f.__name__}", daemon=True)
               for f in (send, read_stderr, watch)]
    for thread in helpers:
        thread.start()
    try:
        processor = ansible_runner.run(private_data_dir=str(pdd), ident=run_id, streamer="process", _input=stream,
                                       event_handler=on_event, status_handler=on_status, quiet=True, settings={})
        out.artifact_dir = Path(processor.artifact_dir)
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as exc:  # a stream that does not parse: said below
        final.setdefault("status", "error")
        final.setdefault("job_explanation", f"its stream could not be read ({type(exc).__name__}: {exc})")
    finally:
        done.set()
        try:
            proc.wait(timeout=EXIT_GRACE_S)
        except subprocess.TimeoutExpired:
            _kill(proc)
            proc.wait()
        for thread in helpers:
            thread.join(timeout=EXIT_GRACE_S)
        for pipe in (proc.stdout, proc.stderr):
            pipe.close()
    out.status = str(final.get("status") or "error")
    out.rc = _rc(out.artifact_dir, proc.returncode)
    out.received = stream.received
    if stopped and stopped[0] in ("canceled", "timeout"):
        out.status = stopped[0]
    elif not (out.status in ("successful", "failed", "timeout", "canceled") and seen_stats.is_set()):
        out.problem = _problem(out, final, stopped, proc.returncode)
        out.status = "failed"
    _settle(out, collector, seen_stats)
    return out


def _kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        signal_processes([proc.pid], signal.SIGKILL, group=True)


def _rc(artifact_dir: Path | None, ssh_rc: int | None) -> int:
    if artifact_dir is not None:
        try:
            return int((artifact_dir / "rc").read_text().strip())
        except (OSError, ValueError):
            pass
    return ssh_rc if ssh_rc is not None else -1


def _problem(out: NodeRun, final: dict[str, Any], stopped: list[str], ssh_rc: int | None) -> str:
    """Why a node delivered no result. Decided by what fdl did (stopped), ssh's exit status and ansible-runner's
    structured status (the final one the node's worker sent, or the explanation of the process side); what ssh, the
    node or its ansible-playbook wrote is quoted, never parsed."""
    said = out.stderr[-1] if out.stderr else "no message"
    if stopped and stopped[0] == "idle":
        return (f"the execution node sent nothing for {IDLE_LIMIT_S:.0f} s (not even its keepalive), so its link or "
                f"its ansible-runner worker hung")
    if ssh_rc == 255 and out.received:
        return f"the connection to the execution node was lost while the job ran (ssh exit 255: {said})"
    if ssh_rc == 255:
        return f"ssh to the execution node failed (exit 255): {said}"
    if out.unsent is not None:
        return f"the job could not be sent to the execution node ({out.unsent})"
    if out.ended is not None:  # the node's ansible-playbook ran and exited before its play's final stats
        if out.output:
            return f"the job failed on the execution node: {_quote(out.output)}"
        return (f"the execution node ended the job without a result (ansible-runner status {out.ended}, "
                f"ansible-playbook exit {out.rc}: {said})")
    if ssh_rc in (126, 127):
        return (f"the execution node cannot run {NODE_VENV}/bin/ansible-runner (exit {ssh_rc}: {said}); prepare it "
                f"with the flodl.fdl.execution_node playbook")
    explanation = str(final.get("job_explanation") or "").strip()
    if explanation:
        return f"the job failed on the execution node: {explanation} (ssh exit {ssh_rc}; {said})"
    return f"the execution node ended the job without a result (ssh exit {ssh_rc}: {said})"


def _quote(lines: list[str]) -> str:
    """The line of ansible-playbook's output to show in a problem: its error line when it printed one (`[ERROR]:`
    from ansible-core 2.19, `ERROR!` before), else its last. For display only: what decides that the job failed is
    ansible-runner's status."""
    for line in lines:
        if line.lstrip().startswith("[ERROR]") or "ERROR!" in line:
            return line.strip()
    return lines[-1].strip()


def _settle(out: NodeRun, collector: Collector, seen_stats: threading.Event) -> None:
    """When the node failed, the hosts it did not answer for become unreachable through it; and its part of the run
    counts as done for the callers waiting on every part's final stats.

    A host's answer is final only at the play's final stats: before them, a host that is "ok" has passed the
    tasks so far (the role's argument validation, which runs on the node itself, passes at once) and may still
    be inside its next one. So a node whose stats never came leaves every one of its hosts unreachable through it,
    but for those Ansible had already failed or found unreachable: that verdict is final, and its reason stands."""
    if out.problem is not None:
        now = time.monotonic()
        unanswered = (PENDING, RUNNING) if seen_stats.is_set() else (PENDING, RUNNING, OK, SKIPPED)
        with collector.lock:
            for name in out.hosts:
                host = collector.hosts[name]
                if host.status in unanswered:
                    host.status = UNREACHABLE
                    host.message = f"unreachable through {out.node}: {out.problem}"
                    host.current_task = None
                    host.finished = now
            if collector.progress is not None:
                collector.progress.update(collector.hosts)
    if not seen_stats.is_set():
        collector.part_done()


# --------------------------------------------------------------------------- a run in parts


@dataclass
class Part:
    """A piece of a run: the direct hosts (run by `direct`, fdl.cluster.runner's ansible_runner.run), or one
    execution node's hosts."""

    name: str  # "" for the direct part, else the node
    hosts: list[str]
    direct: Callable[[Callable[[dict[str, Any]], bool]], Any] | None = None
    argv: list[str] = field(default_factory=list)
    job: Path | None = None
    rel_playbook: str = ""
    pdd: Path | None = None


def run_parts(parts: list[Part], *, run_id: str, collector: Collector, cancel: Callable[[], bool],
              timeout: float | None) -> Any:
    """Run every part at once into one collector; a runner-like result (status, rc, config.artifact_dir) for the
    whole: canceled when canceled, timeout when a part timed out, successful when every part was, else failed."""
    results: dict[str, Any] = {}
    errors: list[BaseException] = []
    collector.parts = len(parts)

    def direct(part: Part) -> None:
        seen = threading.Event()

        def handler(event: dict[str, Any]) -> bool:
            if event.get("event") == "playbook_on_stats":
                seen.set()
            return collector(event)

        try:
            assert part.direct is not None
            runner = part.direct(handler)
            results[part.name] = SimpleNamespace(status=runner.status, rc=runner.rc,
                                                 artifact_dir=Path(runner.config.artifact_dir))
        except BaseException as exc:  # handed to the caller once every part has ended
            errors.append(exc)
        finally:
            if not seen.is_set():
                collector.part_done()

    def through(part: Part) -> None:
        try:
            assert part.job is not None and part.pdd is not None
            results[part.name] = run_on_node(part.name, part.argv, part.job, part.rel_playbook, part.pdd, run_id,
                                             part.hosts, collector, cancel, timeout, forks=len(part.hosts))
        except BaseException as exc:
            errors.append(exc)
            collector.part_done()

    threads = [threading.Thread(target=direct if part.direct is not None else through, args=(part,),
                                name=f"fdl-part-{part.name or 'direct'}") for part in parts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    statuses = [r.status for r in results.values()]
    if cancel():
        status = "canceled"
    elif "timeout" in statuses:
        status = "timeout"
    elif statuses and all(s == "successful" for s in statuses):
        status = "successful"
    else:
        status = "failed"
    rcs = [r.rc for r in results.values() if r.rc not in (0, None)]
    first = results.get("") or next(iter(results.values()), None)
    artifact_dir = getattr(first, "artifact_dir", None) or Path(".")
    return SimpleNamespace(status=status, rc=rcs[0] if rcs else 0, config=SimpleNamespace(artifact_dir=artifact_dir),
                           parts=results)


def node_part(inventory: ClusterInventory, node: str, hosts: list[str], pdd: Path, run_id: str, playbook: Path,
              inventory_json: str, variables_json: str, ship: dict[str, Path] | None) -> Part:
    """The part of a run one node carries: its job directory laid out, and the ssh that runs the worker there."""
    job, rel = job_dir(pdd, run_id, inventory_json, variables_json, playbook, ship)
    argv = [*node_ssh_argv(node_host(inventory, node)), worker_command()]
    return Part(name=node, hosts=hosts, argv=argv, job=job, rel_playbook=rel, pdd=pdd)


def remove_job(part: Part) -> None:
    if part.job is not None:
        shutil.rmtree(part.job, ignore_errors=True)


# --------------------------------------------------------------------------- preparing nodes


def pinned_packages() -> dict[str, str]:
    """{package: release} a node needs: the ansible-core and ansible-runner this environment runs (installed at
    the releases constraints.txt pins), so a node runs the same ansible-core line as this machine."""
    from importlib import metadata

    return {name: metadata.version(name) for name in ("ansible-core", "ansible-runner")}


def constraint_lines() -> list[str]:
    """The requirement lines of fdl's constraints.txt, when fdl runs from a clone that has it (a node's pip then
    resolves the packages' dependencies to the same releases); none otherwise."""
    from fdl.resources import share_dir

    try:
        text = (share_dir() / "constraints.txt").read_text()
    except OSError:
        return []
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
