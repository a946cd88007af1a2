"""The controller endpoint: join window, roster, start switch and state.json (native asyncio).

Modules, lightest first (`fdl status`/`fdl start` import only the first four):

- `protocol`: the join protocol's messages and their validation.
- `client`: the requests-based client every caller shares (status, start, the join agent).
- `address`: where status/start look for a controller.
- `render`: the human view of state.json.
- `policy`, `world`: the run's rules, the rank assignment.
- `states`, `machine`: the run's phases, members and refusals; the pure state machine over them.
- `wire`, `gate`, `routes`: HTTP bounds and the JSON envelope; connection admission; the endpoints.
- `server`: the aiohttp endpoint around the machine, in a loop or a background thread.
"""
