"""The run's state machine: join window, roster, start switch, liveness, exits.

Pure Python, no I/O and no asyncio: every method runs to completion, reads
time from the injected clock, and raises `Refused` when a request is turned
down. The HTTP layer (`fdl.controller.server`) is a thin shell around it; tests
drive it directly with a fake clock.

Lifecycle::

    waiting --quorum met--> staging --(auto/hybrid: clock or roster complete;
       ^                       |       manual/hybrid: start switch)--> forming
       +----quorum lost--------+                                         |
                                       every member's ranks running --> training
    any open phase --window closes without what it needs--> failed       |
    forming/training --a member exits non-zero or goes silent--> failed  |
                                       every member exited 0 ----------> done
"""

from __future__ import annotations

import hmac
import json
import secrets
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from fdl.controller.auth import new_controller_id
from fdl.controller.policy import RunPolicy, addresses_of, normalize_ip
from fdl.controller.protocol import Hello
from fdl.controller.states import (
    DONE,
    FAILED,
    FORMING,
    OPEN,
    SNAPSHOT_S,
    STAGING,
    STATE_SCHEMA,
    TERMINAL,
    TRAINING,
    WAITING,
    Member,
    Refused,
    Switch,
)
from fdl.controller.world import World, build_world

__all__ = ["RunMachine"]


_JSON: dict[str, Any] = {"separators": (",", ":")}


class RunMachine:
    """One run's join window and lifecycle. Not thread-safe: call it from one thread (the server's loop)."""

    def __init__(self, policy: RunPolicy, *, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time, controller_id: str | None = None):
        self.policy = policy
        self.clock = clock
        # This controller instance: random at every start, published in state.json and GET /join/id; every proof
        # of the token names it, so a request proved here is worth nothing at any other controller.
        self.controller_id = controller_id or new_controller_id()
        self._epoch = wall() - clock()  # mono + epoch = unix time, for display
        self.phase = WAITING
        self.reason: str | None = None
        self.version = 0
        self.members: dict[str, Member] = {}  # host -> member, in admission order
        self._by_id: dict[str, Member] = {}
        self._next_id = 0
        self.ranks = 0
        self.cohort_run_id: str | None = policy.run_id
        self.cohort_signature: str | None = None
        self.opened_at: float | None = None
        self.deadline: float | None = None
        self.switch = Switch.NONE if policy.start == "auto" else Switch.UNARMED
        self.fired_at: float | None = None
        self.fired_by: str | None = None
        self.world: World | None = None
        self.formed_at: float | None = None
        self.formed_by: str | None = None
        self.ended_at: float | None = None
        self.departed: deque[dict[str, Any]] = deque(maxlen=32)
        self.refusals: dict[str, int] = {}  # refused requests by reason
        self.admissions = 0  # hellos admitted (a host that was dropped and joins again counts twice)
        self.exits: dict[int, int] = {}  # exit reports by code
        self.listeners: list[Callable[[RunMachine], None]] = []
        self._roster_cache: bytes | None = None
        self._roster_built = 0.0
        self._state_cache: bytes | None = None
        self._state_key: tuple[int, int] = (-1, -1)
        self._seen_dirty = False
        self._roster_index = {host: i for i, host in enumerate(policy.roster_names)}
        self._roster_peers: dict[str, frozenset[str]] = {}  # roster host -> the IPs its address names
        self.peers: dict[str, int] = {}  # admitted members' peer addresses -> how many members each
        self._shed_at: dict[str, float] = {}  # member peer address -> when a connection from it was shed for load

    def shed(self, peer: str | None) -> None:
        """The server refused a connection from peer for load: a member there is not silent meanwhile."""
        if peer is not None and peer in self.peers:
            self._shed_at[peer] = self.clock()

    def _quiet_for(self, member: Member, now: float) -> float:
        """How long a member has been silent, not counting time its address was being shed for load."""
        seen = member.last_seen
        if member.peer_ip is not None:
            seen = max(seen, self._shed_at.get(member.peer_ip, seen))
        return now - seen

    def resolve_roster(self) -> None:
        """Resolve every roster address now (the server does it off its loop, before the first hello)."""
        for entry in self.policy.roster:
            self._roster_peers[entry.host] = addresses_of(entry.address or entry.host)

    def _roster_peer_ok(self, host: str, peer: str) -> bool:
        entry = self.policy.roster[self._roster_index[host]]
        allowed = self._roster_peers.get(host)
        if allowed is None:
            allowed = self._roster_peers[host] = addresses_of(entry.address or entry.host)
        return normalize_ip(peer) in allowed

    # ------------------------------------------------------------------ helpers

    def _changed(self) -> None:
        self.version += 1
        self._roster_cache = None
        for listener in list(self.listeners):
            listener(self)

    def _touch(self, member: Member, now: float) -> None:
        member.last_seen = now
        member.frag = None
        self._seen_dirty = True

    def refuse(self, reason: str, message: str, *, status: int = 409, extra: dict[str, Any] | None = None) -> Refused:
        """A refusal, counted by reason (state.json `refusals`); the caller raises it."""
        self.refusals[reason] = self.refusals.get(reason, 0) + 1
        return Refused(reason, message, status=status, extra=extra)

    def now(self) -> float:
        """This controller's clock, as Unix time."""
        return self.clock() + self._epoch

    def _auth_ok(self, trusted: bool, *, what: str) -> None:
        """Requests that proved the run's token and the launcher in-process pass, whatever their address
        (loopback is not a credential: every account on the box shares it); anyone passes in a run without a
        token, which a server allows only under the explicit insecure_no_token opt-out."""
        if trusted or self.policy.token is None:
            return
        raise self.refuse("bad_token", f"no proof of the run's token: a {what} must be signed with the run's token "
                                        f"(from the controller box and through an ssh tunnel too).", status=403)

    @property
    def have_hosts(self) -> int:
        return len(self.members)

    def quorum(self) -> dict[str, Any]:
        p = self.policy
        met = self.have_hosts >= max(p.need_hosts, 1) and self.ranks >= p.need_ranks
        return {"need": {"hosts": p.need_hosts, "ranks": p.need_ranks},
                "have": {"hosts": self.have_hosts, "ranks": self.ranks}, "met": met}

    def quorum_met(self) -> bool:
        p = self.policy
        return self.have_hosts >= max(p.need_hosts, 1) and self.ranks >= p.need_ranks

    def quorum_text(self) -> str:
        p = self.policy
        text = f"{self.have_hosts} of {max(p.need_hosts, 1)} hosts"
        if p.need_ranks:
            text += f", {self.ranks} of {p.need_ranks} ranks"
        return text

    def roster_complete(self) -> bool:
        if not self.policy.discovery:
            return self.have_hosts == len(self.policy.roster)
        return self.have_hosts >= self.policy.capacity or self.ranks >= self.policy.max_ranks

    def window_open(self, now: float | None = None) -> bool:
        if self.phase not in OPEN:
            return False
        now = self.clock() if now is None else now
        return self.deadline is None or now < self.deadline

    def seconds_left(self, now: float | None = None) -> float | None:
        if self.deadline is None or self.phase not in OPEN:
            return None
        now = self.clock() if now is None else now
        return max(0.0, self.deadline - now)

    def member(self, ticket: str) -> Member:
        """The member a ticket belongs to (constant-time secret compare)."""
        ident, _, secret = ticket.partition(".")
        member = self._by_id.get(ident)
        if member is None or not hmac.compare_digest(member.secret.encode(), secret.encode("utf-8", "replace")):
            raise self.refuse(
                "unknown_ticket", "this ticket belongs to no member of the run (never admitted, left, or dropped "
                                  "after going silent); say hello again.", status=410)
        return member

    # ------------------------------------------------------------------ join

    def hello(self, hello: Hello, *, peer: str, trusted: bool, authed: bool = False,
              in_process: bool = False) -> Member:
        """Admit a host or raise Refused naming why not.

        trusted: the caller vouches for it (in-process callers); authed: its request proved the run's token;
        in_process: the launcher itself (the only caller that may admit the hosts it reserved)."""
        now = self.clock()
        self._check_clock(now)
        p = self.policy
        self._auth_ok(trusted or authed or in_process, what="join")
        if hello.host in p.reserved and not in_process:
            raise self.refuse(
                "reserved_host", f"host {hello.host!r} is one the launcher runs itself: no hello over the network "
                                 f"may take its name, for the life of the run.", status=403)
        if not self.window_open(now):
            raise self.refuse("window_closed", self.closed_text())
        if not p.discovery and hello.host not in self._roster_index:
            raise self.refuse(
                "not_in_roster", f"host {hello.host!r} is not in this run's roster (cluster.workers); this window "
                                 f"admits only {_names(p.roster_names)}.")
        roster_entry = p.roster[self._roster_index[hello.host]] if not p.discovery else None
        devices = hello.devices
        if roster_entry is not None:
            # The roster wins over what a hello says: its address (and the peer must come from it) and devices.
            if not in_process and not self._roster_peer_ok(hello.host, peer):
                raise self.refuse(
                    "wrong_address", f"host {hello.host!r} is a roster host, and it joins only from its roster "
                                     f"address {roster_entry.address or roster_entry.host}, not from {peer}.",
                    status=403)
            if roster_entry.devices.is_cpu or roster_entry.devices.ids is not None:
                devices = roster_entry.devices
            address = roster_entry.address or hello.address or peer
            if in_process and hello.address:
                address = hello.address
        else:
            address = hello.address or peer
        if hello.host in self.members:
            raise self.refuse(
                "host_joined", f"host {hello.host!r} has already joined this window; a host joins once (a silent "
                               f"member is dropped after {p.silence_s:g} s, then it may join again).")
        # The launcher's own hosts (in_process) run what it staged and carry no publish's run id: the cohort's
        # run id is the walk-ins' (docs/launcher.md, "Discovery windows"), so only walk-ins are held to it.
        walk_ins = self._walk_ins()
        if not in_process and (walk_ins or p.run_id is not None) and hello.run_id != self.cohort_run_id:
            raise self.refuse(
                "run_id_differs", f"run id {hello.run_id!r} differs from the cohort's {self.cohort_run_id!r}: this "
                                  f"box holds a different publish than the hosts already in the window. Fetch the "
                                  f"current run and dial again.")
        if hello.signature is not None and self.cohort_signature is not None \
                and hello.signature != self.cohort_signature:
            raise self.refuse(
                "signature_differs", f"model signature {hello.signature} differs from the cohort's "
                                     f"{self.cohort_signature}: this box builds a different model.")
        ranks = devices.ranks()
        if self.have_hosts >= p.capacity:
            raise self.refuse("roster_full", f"the roster is full ({p.capacity} hosts).")
        if self.ranks + ranks > p.max_ranks:
            raise self.refuse("roster_full", f"admitting {ranks} more ranks would pass the world's limit of "
                                              f"{p.max_ranks} ranks ({self.ranks} already).")
        data_path = hello.data_path or (roster_entry.data_path if roster_entry else None) or p.data_path
        self._next_id += 1
        member = Member(
            id=f"m{self._next_id}", secret=secrets.token_hex(16), host=hello.host, address=address, peer=peer,
            devices=devices, ranks=ranks, run_id=hello.run_id, signature=hello.signature,
            data_path=data_path, gpu_ram_share=hello.gpu_ram_share, gpu_names=hello.gpu_names,
            agent=hello.agent, admitted_at=now, last_seen=now, peer_ip=None if in_process else normalize_ip(peer))
        if member.peer_ip is not None:
            self.peers[member.peer_ip] = self.peers.get(member.peer_ip, 0) + 1
        if not in_process and not walk_ins:
            self.cohort_run_id = hello.run_id if p.run_id is None else p.run_id
        if self.cohort_signature is None and hello.signature is not None:
            self.cohort_signature = hello.signature
        self.members[hello.host] = member
        self._by_id[member.id] = member
        self.ranks += ranks
        self.admissions += 1
        if self.opened_at is None:
            self.opened_at = now
            self.deadline = now + p.window_s
        self._evaluate(now)
        self._changed()
        return member

    def _remove(self, member: Member, reason: str, now: float) -> None:
        if member.peer_ip is not None:
            left = self.peers.get(member.peer_ip, 1) - 1
            if left > 0:
                self.peers[member.peer_ip] = left
            else:
                self.peers.pop(member.peer_ip, None)
                self._shed_at.pop(member.peer_ip, None)
        del self.members[member.host]
        del self._by_id[member.id]
        self.ranks -= member.ranks
        self.departed.append({"host": member.host, "reason": reason, "at": round(now + self._epoch, 3)})
        if not self._walk_ins():
            self.cohort_run_id = self.policy.run_id
            self.cohort_signature = None

    def _walk_ins(self) -> list[Member]:
        """The members that dialled in (the launcher's own hosts join in-process, from no peer address)."""
        return [m for m in self.members.values() if m.peer_ip is not None]

    def closed_text(self) -> str:
        if self.phase in (FORMING, TRAINING):
            return f"the window already closed: the world formed ({self.formed_by}) and the run is {self.phase}."
        if self.phase in TERMINAL:
            return f"the window already closed: the run is {self.phase}" + (f" ({self.reason})." if self.reason
                                                                             else ".")
        return "the window already closed (its deadline passed)."

    # ------------------------------------------------------------------ transitions

    def _check_clock(self, now: float) -> None:
        """Cheap (O(1)) deadline check, done on every request."""
        if self.phase in OPEN and self.deadline is not None and now >= self.deadline:
            self._evaluate(now)
            self._changed()

    def _evaluate(self, now: float) -> None:
        """Move an open window to where its members, its clock and its mode put it."""
        if self.phase not in OPEN:
            return
        mode = self.policy.start
        if self.deadline is not None and now >= self.deadline:
            if mode == "manual":
                self._fail(f"the window closed before the start switch was fired ({self.quorum_text()})", now)
            elif self.quorum_met():
                self._form("window deadline", now)
            else:
                self._fail(f"the window closed without quorum ({self.quorum_text()})", now)
            return
        if mode in ("auto", "hybrid") and self.members and self.roster_complete() and self.quorum_met():
            self._form("roster complete", now)
            return
        self.phase = STAGING if self.quorum_met() else WAITING

    def _form(self, by: str, now: float) -> None:
        members = list(self.members.values())
        if not self.policy.discovery:
            members.sort(key=lambda m: self._roster_index[m.host])
        self.world = build_world(members, run_id=self.cohort_run_id, master_addr=self.policy.master_addr,
                                 master_port=self.policy.master_port, controller=self.policy.controller_addr,
                                 args=self.policy.args, launch_id=self.policy.launch_id)
        self.phase = FORMING
        self.formed_at = now
        self.formed_by = by
        for member in members:
            member.frag = None

    def _fail(self, reason: str, now: float) -> None:
        if self.phase in TERMINAL:
            return
        self.phase = FAILED
        self.reason = reason
        self.ended_at = now

    def fire(self, *, peer: str, trusted: bool) -> None:
        """The start switch: form the world now, or raise Refused (never queued). trusted: the request proved
        the run's token (or an in-process caller)."""
        now = self.clock()
        self._check_clock(now)
        self._auth_ok(trusted, what="start")
        if self.policy.start == "auto":
            raise self.refuse("auto_mode", "this run starts on its own (start: auto): there is no switch to fire. "
                                            "It forms when the roster is complete or the window closes.")
        if not self.window_open(now):
            raise self.refuse("window_closed", self.closed_text())
        if not self.quorum_met():
            q = self.quorum()
            raise self.refuse("quorum_not_met", f"quorum not met: {self.quorum_text()} have joined.",
                               extra={"have": q["have"], "need": q["need"]})
        self.switch = Switch.FIRED
        self.fired_at = now
        self.fired_by = peer
        self._form("start switch", now)
        self._changed()

    def tick(self) -> None:
        """Time-driven transitions: the window deadline and silent members. O(members)."""
        now = self.clock()
        changed = False
        if self.phase in OPEN:
            silent = [m for m in self.members.values()
                      if m.polls == 0 and now - m.last_seen > self.policy.silence_s
                      and self._quiet_for(m, now) > self.policy.silence_s]
            for member in silent:
                self._remove(member, f"dropped: silent for {now - member.last_seen:.1f} s before the world "
                                     f"formed", now)
            if silent or (self.deadline is not None and now >= self.deadline):
                self._evaluate(now)
                changed = True
        elif self.phase in (FORMING, TRAINING):
            for member in self.members.values():
                if member.exit_code is None and member.polls == 0 \
                        and now - member.last_seen > self.policy.silence_s \
                        and self._quiet_for(member, now) > self.policy.silence_s:
                    self._fail(f"host {member.host} went silent: no heartbeat for "
                               f"{now - member.last_seen:.1f} s after the world formed", now)
                    changed = True
                    break
        if changed:
            self._changed()

    def next_deadline_in(self) -> float | None:
        """Seconds until the window deadline, while it is open (the server wakes then)."""
        return self.seconds_left()

    # ------------------------------------------------------------------ members after admission

    def poll_begin(self, ticket: str) -> Member:
        now = self.clock()
        self._check_clock(now)
        member = self.member(ticket)
        member.polls += 1
        self._touch(member, now)
        return member

    def poll_end(self, member: Member) -> None:
        member.polls = max(0, member.polls - 1)
        if self._by_id.get(member.id) is member:
            self._touch(member, self.clock())

    def world_reply(self, member: Member) -> bytes | None:
        """The member's serialized world once formed (None while the window is open)."""
        if self.world is None or member.host not in self.world.seats:
            return None
        if not member.fetched:
            member.fetched = True
            member.frag = None
            self._changed()
        return self.world.assignment_json(member.host, {"ok": True, "formed": True,
                                                         "heartbeat_s": self.policy.heartbeat_s})

    def heartbeat(self, ticket: str, *, running: bool = False) -> Member:
        now = self.clock()
        self._check_clock(now)
        member = self.member(ticket)
        self._touch(member, now)
        if running and not member.running and self.world is not None:
            member.running = True
            if self.phase == FORMING and all(m.running or m.exit_code is not None for m in self.members.values()):
                self.phase = TRAINING
            self._changed()
        return member

    def report_exit(self, ticket: str, code: int, detail: str | None = None) -> Member:
        now = self.clock()
        self._check_clock(now)
        member = self.member(ticket)
        self._touch(member, now)
        if member.exit_code is None:  # the first report of each member counts
            self.exits[code] = self.exits.get(code, 0) + 1
        if self.world is None and self.phase in OPEN:
            self._remove(member, f"left before the world formed (exit code {code})", now)
            self._evaluate(now)
            self._changed()
            return member
        if member.exit_code is not None:
            return member
        member.exit_code = code
        member.detail = detail
        if code != 0:
            self._fail(f"host {member.host} exited {code}" + (f": {detail}" if detail else ""), now)
        elif self.phase in (FORMING, TRAINING) and all(m.exit_code == 0 for m in self.members.values()):
            self.phase = DONE
            self.ended_at = now
        self._changed()
        return member

    def fail(self, reason: str) -> None:
        """For a launcher: end the run as failed with a reason (a no-op once it has ended)."""
        if self.phase not in TERMINAL:
            self._fail(reason, self.clock())
            self._changed()

    # ------------------------------------------------------------------ state.json

    def _epoch_of(self, mono: float | None) -> float | None:
        return None if mono is None else round(mono + self._epoch, 3)

    def roster_json(self) -> bytes:
        """The roster as a JSON array, rebuilt only when it changed (last_seen: one-second granularity)."""
        now = self.clock()
        if self._roster_cache is not None and (not self._seen_dirty or now - self._roster_built < 1.0):
            return self._roster_cache
        parts = []
        seats = self.world.seats if self.world is not None else None
        for member in self.members.values():
            if member.frag is None:
                first = seats[member.host].first_rank if seats and member.host in seats else None
                member.frag = json.dumps(member.to_dict(self._epoch, first), **_JSON).encode()
            parts.append(member.frag)
        self._roster_cache = b"[" + b",".join(parts) + b"]"
        self._roster_built = now
        self._seen_dirty = False
        return self._roster_cache

    def state_head(self) -> dict[str, Any]:
        """Everything in state.json but the roster (small; time-dependent fields computed now)."""
        now = self.clock()
        p = self.policy
        left = self.seconds_left(now)
        startable = (p.start != "auto" and self.phase == STAGING and self.window_open(now))
        return {
            "schema": STATE_SCHEMA,
            "version": self.version,
            "now": round(now + self._epoch, 3),
            "phase": self.phase,
            "reason": self.reason,
            "run_id": self.cohort_run_id,
            "launch_id": p.launch_id,
            "controller_id": self.controller_id,
            "signature": self.cohort_signature,
            "kind": "discovery" if p.discovery else "roster",
            "controller": p.controller_addr,
            "start": {"mode": p.start, "switch": self.switch, "startable": startable,
                      "fired_at": self._epoch_of(self.fired_at), "fired_by": self.fired_by},
            "window": {"window_s": p.window_s, "open": self.window_open(now),
                       "opened_at": self._epoch_of(self.opened_at), "deadline": self._epoch_of(self.deadline),
                       "seconds_left": None if left is None else round(left, 3)},
            "quorum": self.quorum(),
            "expected": [h for h in p.roster_names if h not in self.members] if not p.discovery else [],
            "world": None if self.world is None else {
                **self.world.summary(), "formed_at": self._epoch_of(self.formed_at), "formed_by": self.formed_by},
            "ended_at": self._epoch_of(self.ended_at),
            "departed": list(self.departed),
            "refusals": dict(self.refusals),
            "admissions": self.admissions,
            "exits": {str(code): n for code, n in sorted(self.exits.items())},
            "limits": {"max_hosts": p.capacity, "max_ranks": p.max_ranks, "heartbeat_s": p.heartbeat_s,
                       "silence_s": p.silence_s},
        }

    def state_json(self) -> bytes:
        """state.json: a snapshot at most SNAPSHOT_S old, rebuilt at once whenever the state changes."""
        now = self.clock()
        key = (self.version, int(now / SNAPSHOT_S))
        if self._state_key != key or self._state_cache is None:
            head = json.dumps(self.state_head(), **_JSON).encode()
            self._state_cache = head[:-1] + b',"roster":' + self.roster_json() + b"}"
            self._state_key = key
        return self._state_cache

    def state(self) -> dict[str, Any]:
        """state.json as a dict (for in-process callers and tests)."""
        state: dict[str, Any] = json.loads(self.state_json())
        return state


def _names(names: tuple[str, ...], limit: int = 8) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")
