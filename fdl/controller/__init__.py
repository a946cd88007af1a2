"""The controller endpoint: join window, roster, start switch and state.json (native asyncio, never Ansible).

Modules, lightest first (`fdl status`/`fdl start` import the client side only: `protocol`, `auth`, `client`,
`address`, `live`, `view`, `watch`; their human views live in fdl.cli.render.status):

- `protocol`: the join protocol's messages and their validation.
- `auth`: proof of the run's token without sending it (request and answer signing).
- `client`: the requests-based client every caller shares (status, start, the join agent).
- `address`: where status/start look for a controller.
- `live`: the records of this user's live launcher runs (the launcher writes them; `address` and
  `fdl status` read them) and their kept state and token.
- `view`: what a state.json says, read as data (deadlines, quorum and roster counts).
- `watch`: `fdl status --watch` following a run until its controller goes away.
- `policy`, `world`: the run's rules, the rank assignment.
- `states`, `machine`: the run's phases, members and refusals; the pure state machine over them.
- `wire`, `gate`, `routes`: HTTP bounds and the JSON envelope; connection admission; the endpoints.
- `metrics`: `GET /metrics`, the run as Prometheus metrics.
- `server`: the aiohttp endpoint around the machine, in a loop or a background thread (`page.html`, GET /).
"""
