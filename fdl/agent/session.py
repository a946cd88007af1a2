"""One dial of the controller: the `--ssh` tunnel when asked for, the hello on the join channel
(fdl.controller.client, the same client `fdl status` uses) and the long-poll for the world."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from fdl import __version__
from fdl.agent.failures import Stopped, refusal_error, unreachable
from fdl.agent.options import JoinOptions
from fdl.agent.prepare import Prepared
from fdl.agent.tunnel import Tunnel, local_address_toward

if TYPE_CHECKING:
    from fdl.controller.client import ControllerClient
    from fdl.controller.protocol import Hello

__all__ = ["WORLD_POLL_S", "Dial"]

WORLD_POLL_S = 20.0


class Dial:
    """The box's dials of its controller: opens a session, says hello, waits for the world. What the network
    answers is raised as a transient failure (fdl.agent.failures); the clock skew the last answer claimed is kept
    for the warning a `--persist` box prints."""

    def __init__(self, options: JoinOptions, host: str, *, environ: Mapping[str, str], note: Callable[[str], None]):
        self.options = options
        self.host = host
        self.environ = environ
        self.note = note
        self.shown = options.controller_text
        self.tunneled = False
        self.skew: float | None = None  # the controller's clock minus this box's, as its GET /join/id claimed
        self.skew_proven = False  # whether that answer proved the run's token

    @contextlib.contextmanager
    def session(self) -> Iterator[ControllerClient]:
        """The controller's client for one attempt, through the ssh tunnel when asked for (closed on the way out)."""
        from fdl.controller.client import ControllerClient

        opts = self.options
        tunnel = Tunnel(opts.ssh, opts.controller, identity=opts.identity, note=self.note,
                        environ=self.environ, known_hosts=opts.known_hosts) if opts.ssh else None
        self.tunneled = tunnel is not None
        with tunnel if tunnel is not None else contextlib.nullcontext():
            self.shown = opts.controller_text + (f" (via ssh {opts.ssh})" if opts.ssh else "")
            with ControllerClient(opts.controller_text, timeout=10.0, token=opts.token,
                                  socket_path=tunnel.socket_path if tunnel is not None else None) as client:
                yield client

    def join(self, client: ControllerClient, prep: Prepared) -> tuple[str, dict[str, Any]]:
        """Say hello; the member's ticket and the controller's admission (ranks, phase...), or a transient
        failure."""
        from fdl.controller.client import ControllerError, ControllerRefused

        try:
            admitted = client.hello(self._hello(prep))
        except ControllerRefused as exc:
            raise refusal_error(exc, self.shown) from None
        except ControllerError as exc:
            raise unreachable(exc, self.tunneled) from None
        finally:
            if client.clock_skew is not None:
                self.skew, self.skew_proven = client.clock_skew, client.clock_proven
        ticket = str(admitted["ticket"])
        left = admitted.get("seconds_left")
        self.note(f"admitted by {self.shown} as {admitted.get('host', self.host)} with {admitted.get('ranks')} "
                  f"rank(s); phase {admitted.get('phase')}"
                  + (f", window closes in {left:.0f} s" if isinstance(left, (int, float)) else ""))
        return ticket, admitted

    def _hello(self, prep: Prepared) -> Hello:
        from fdl.controller.protocol import Hello

        opts = self.options
        address = None
        if opts.ssh is not None:  # the controller sees the tunnel's loopback: tell it where this box really is
            address = local_address_toward(opts.ssh.host, opts.ssh.port or 22)
        return Hello(host=self.host, devices=prep.offer.devices, run_id=prep.run_id, signature=prep.signature,
                     address=address, data_path=prep.data_root,
                     gpu_ram_share=opts.gpu_ram_share, gpu_names=prep.offer.gpu_names,
                     agent=f"fdl-join/{__version__}")

    def wait_world(self, client: ControllerClient, ticket: str) -> dict[str, Any]:
        """Long-poll until the world forms; stopped before it does, the box leaves the window first."""
        from fdl.controller.client import ControllerError, ControllerRefused

        try:
            while True:
                world = client.wait_world(ticket, wait_s=WORLD_POLL_S)
                if world is not None:
                    return world
        except ControllerRefused as exc:
            raise refusal_error(exc, self.shown) from None
        except ControllerError as exc:
            raise unreachable(exc, self.tunneled) from None
        except Stopped as exc:  # leave the window before it forms, so the roster stays true
            with contextlib.suppress(Exception):
                client.report_exit(ticket, 128 + exc.signum, "stopped before the world formed")
            raise
