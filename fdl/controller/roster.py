"""Who is in the run: admission of hellos, the members and their tickets, addresses, quorum and departures."""

from __future__ import annotations

import hmac
import secrets
from collections import deque
from typing import Any

from fdl.controller.policy import RunPolicy, addresses_of, normalize_ip
from fdl.controller.protocol import Hello
from fdl.controller.states import Member
from fdl.controller.tally import Tally

__all__ = ["Roster"]


class Roster:
    """The run's members: admits a hello against the policy (roster, addresses, cohort, limits) or refuses it,
    finds a member by ticket, removes one, and says whether quorum is met. Phases and the clock are not its job:
    the caller checks that the window is open and passes the time in."""

    def __init__(self, policy: RunPolicy, tally: Tally, *, epoch: float):
        self.policy = policy
        self.tally = tally
        self._epoch = epoch  # mono + epoch = unix time, for display
        self.members: dict[str, Member] = {}  # host -> member, in admission order
        self._by_id: dict[str, Member] = {}
        self._next_id = 0
        self.ranks = 0
        self.cohort_run_id: str | None = policy.run_id
        self.cohort_signature: str | None = None
        self.departed: deque[dict[str, Any]] = deque(maxlen=32)
        self.admissions = 0  # hellos admitted (a host that was dropped and joins again counts twice)
        self.seen_dirty = False  # a member's last_seen moved since state.json's roster was last built
        self.index = {host: i for i, host in enumerate(policy.roster_names)}
        self._roster_peers: dict[str, frozenset[str]] = {}  # roster host -> the IPs its address names
        self.peers: dict[str, int] = {}  # admitted members' peer addresses -> how many members each
        self._shed_at: dict[str, float] = {}  # member peer address -> when a connection from it was shed for load

    def shed(self, peer: str | None, now: float) -> None:
        """The server refused a connection from peer for load: a member there is not silent meanwhile."""
        if peer is not None and peer in self.peers:
            self._shed_at[peer] = now

    def quiet_for(self, member: Member, now: float) -> float:
        """How long a member has been silent, not counting time its address was being shed for load."""
        seen = member.last_seen
        if member.peer_ip is not None:
            seen = max(seen, self._shed_at.get(member.peer_ip, seen))
        return now - seen

    def resolve(self) -> None:
        """Resolve every roster address now (the server does it off its loop, before the first hello)."""
        for entry in self.policy.roster:
            self._roster_peers[entry.host] = addresses_of(entry.address or entry.host)

    def _peer_ok(self, host: str, peer: str) -> bool:
        entry = self.policy.roster[self.index[host]]
        allowed = self._roster_peers.get(host)
        if allowed is None:
            allowed = self._roster_peers[host] = addresses_of(entry.address or entry.host)
        return normalize_ip(peer) in allowed

    def touch(self, member: Member, now: float) -> None:
        member.last_seen = now
        member.frag = None
        self.seen_dirty = True

    def member(self, ticket: str) -> Member:
        """The member a ticket belongs to (constant-time secret compare)."""
        ident, _, secret = ticket.partition(".")
        member = self._by_id.get(ident)
        if member is None or not hmac.compare_digest(member.secret.encode(), secret.encode("utf-8", "replace")):
            raise self.tally.refuse(
                "unknown_ticket", "this ticket belongs to no member of the run (never admitted, left, or dropped "
                                  "after going silent); say hello again.", status=410)
        return member

    def holds(self, member: Member) -> bool:
        """Whether this member is still in the run (not removed since)."""
        return self._by_id.get(member.id) is member

    # ------------------------------------------------------------------ quorum

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

    def complete(self) -> bool:
        if not self.policy.discovery:
            return self.have_hosts == len(self.policy.roster)
        return self.have_hosts >= self.policy.capacity or self.ranks >= self.policy.max_ranks

    def in_order(self) -> list[Member]:
        """The members in seat order: the roster's order, or admission order in a discovery window."""
        members = list(self.members.values())
        if not self.policy.discovery:
            members.sort(key=lambda m: self.index[m.host])
        return members

    # ------------------------------------------------------------------ admission

    def check_reserved(self, host: str, *, in_process: bool) -> None:
        if host in self.policy.reserved and not in_process:
            raise self.tally.refuse(
                "reserved_host", f"host {host!r} is one the launcher runs itself: no hello over the network "
                                 f"may take its name, for the life of the run.", status=403)

    def admit(self, hello: Hello, *, peer: str, in_process: bool, now: float) -> Member:
        """Admit a host into an open window, or raise Refused naming why not."""
        p = self.policy
        if not p.discovery and hello.host not in self.index:
            raise self.tally.refuse(
                "not_in_roster", f"host {hello.host!r} is not in this run's roster (cluster.workers); this window "
                                 f"admits only {_names(p.roster_names)}.")
        roster_entry = p.roster[self.index[hello.host]] if not p.discovery else None
        devices = hello.devices
        if roster_entry is not None:
            # The roster wins over what a hello says: its address (and the peer must come from it) and devices.
            if not in_process and not self._peer_ok(hello.host, peer):
                raise self.tally.refuse(
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
            raise self.tally.refuse(
                "host_joined", f"host {hello.host!r} has already joined this window; a host joins once (a silent "
                               f"member is dropped after {p.silence_s:g} s, then it may join again).")
        # The launcher's own hosts (in_process) run what it staged and carry no publish's run id: the cohort's
        # run id is the walk-ins' (docs/launcher.md, "Discovery windows"), so only walk-ins are held to it.
        walk_ins = self._walk_ins()
        if not in_process and (walk_ins or p.run_id is not None) and hello.run_id != self.cohort_run_id:
            raise self.tally.refuse(
                "run_id_differs", f"run id {hello.run_id!r} differs from the cohort's {self.cohort_run_id!r}: this "
                                  f"box holds a different publish than the hosts already in the window. Fetch the "
                                  f"current run and dial again.")
        if hello.signature is not None and self.cohort_signature is not None \
                and hello.signature != self.cohort_signature:
            raise self.tally.refuse(
                "signature_differs", f"model signature {hello.signature} differs from the cohort's "
                                     f"{self.cohort_signature}: this box builds a different model.")
        ranks = devices.ranks()
        if self.have_hosts >= p.capacity:
            raise self.tally.refuse("roster_full", f"the roster is full ({p.capacity} hosts).")
        if self.ranks + ranks > p.max_ranks:
            raise self.tally.refuse("roster_full", f"admitting {ranks} more ranks would pass the world's limit of "
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
        return member

    def remove(self, member: Member, reason: str, now: float) -> None:
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


def _names(names: tuple[str, ...], limit: int = 8) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")
