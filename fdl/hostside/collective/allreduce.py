"""All-reduce smoke test: one process per rank, torch.distributed, results as JSON lines.

Runs standalone on any host with PyTorch: it imports nothing from fdl, not
even its siblings, so the one file is the program (ranks.write_program puts
it where a module of the fdl_probe role's collective step can start it; `fdl
probe --collective` runs it from the package). Every rank is started with the
standard torch.distributed environment (MASTER_ADDR, MASTER_PORT, WORLD_SIZE,
RANK, LOCAL_RANK) and, optionally, fdl's FDL_HOST (a host label; default the
host name) and FDL_BACKEND (nccl or gloo; default nccl when CUDA is usable,
else gloo). PyTorch is the one import beyond the standard library in
fdl/hostside/: it is what this program tests.

    python allreduce.py [--min-bytes 8192] [--max-bytes 67108864] [--budget-s 60]
                        [--max-iters 20] [--exchange-bytes 4194304]

Two phases, both timed on every rank:

1. all-reduce (sum, float32) of each message size from --min-bytes to
   --max-bytes, doubling: a warm-up, then as many iterations as the budget
   allows (at most --max-iters); each rank reports its mean time per size.
2. exchange rounds: in round k every rank sends --exchange-bytes to rank
   r+k and receives as much from rank r-k (mod world), all at once. An
   all-reduce paces every rank to the slowest link, so it cannot say who is
   slow; these rounds can, because each rank times its own traffic.

`--check` only imports PyTorch and reports it (event `torch`: version, CUDA
availability, backends) or exits 3: what each host runs first (in the probe
step), to leave out the hosts that cannot take part.

Each result is a line `fdl-collective {json}` on stdout: events `start`,
`allreduce`, `exchange`, `done`, or `error` (kind torch-missing exits 3,
others exit 1). Rank 0 decides, and tells the others, when the budget is
spent: the test then stops early with `done.truncated` true rather than
overrun (ranks must agree on every collective call, or they hang).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time

PREFIX = "fdl-collective "
EXIT_TORCH_MISSING = 3


def emit(event: str, **fields: object) -> None:
    sys.stdout.write(PREFIX + json.dumps({"event": event, **fields}, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def sizes(low: int, high: int) -> list[int]:
    out, size = [], max(4, low)
    while size <= high:
        out.append(size)
        size *= 2
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="all-reduce smoke test (one rank)")
    parser.add_argument("--min-bytes", type=int, default=8 << 10)
    parser.add_argument("--max-bytes", type=int, default=64 << 20)
    parser.add_argument("--budget-s", type=float, default=60.0)
    parser.add_argument("--max-iters", type=int, default=20)
    parser.add_argument("--exchange-bytes", type=int, default=4 << 20)
    parser.add_argument("--exchange-iters", type=int, default=3)
    parser.add_argument("--check", action="store_true", help="only report whether PyTorch can be imported")
    args = parser.parse_args(argv)
    started = time.monotonic()
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    host = os.environ.get("FDL_HOST") or socket.gethostname()

    try:
        import torch
        import torch.distributed as dist
    except ImportError as exc:
        emit("error", kind="torch-missing", rank=rank, host=host, detail=str(exc), python=sys.executable)
        return EXIT_TORCH_MISSING
    if args.check:
        emit("torch", host=host, version=torch.__version__, cuda=bool(torch.cuda.is_available()),
             gloo=bool(dist.is_gloo_available()), nccl=bool(dist.is_nccl_available()), python=sys.executable)
        return 0

    backend = os.environ.get("FDL_BACKEND") or ("nccl" if torch.cuda.is_available() else "gloo")
    if backend == "nccl":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    from datetime import timedelta

    try:
        dist.init_process_group(backend, timeout=timedelta(seconds=max(30.0, args.budget_s)))
    except Exception as exc:  # a rendezvous that fails must be reported, not a traceback
        emit("error", kind="init", rank=rank, host=host, detail=f"{type(exc).__name__}: {exc}")
        return 1
    emit("start", rank=rank, world=world, local_rank=local_rank, host=host, backend=backend, device=str(device),
         torch=torch.__version__)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def agree(value: float, op: object = dist.ReduceOp.MAX) -> float:
        """Every rank gets the same number (rank 0's decision, or the max of everyone's)."""
        t = torch.tensor([value], dtype=torch.float64, device=device)
        dist.all_reduce(t, op=op)
        return float(t.item())

    def time_left() -> float:
        return float(args.budget_s) - (time.monotonic() - started)

    plan = sizes(args.min_bytes, args.max_bytes)
    phases = len(plan) + 1  # the exchange counts as one more step
    truncated = False
    try:
        for step, size in enumerate(plan):
            # rank 0 owns the clock: go on only if there is time for this step's share
            go = agree(1.0 if rank != 0 or time_left() > 0 else 0.0, dist.ReduceOp.MIN)
            if go < 1.0:
                truncated = True
                break
            tensor = torch.ones(size // 4, dtype=torch.float32, device=device)
            dist.barrier()
            for _warm in range(2 if step == 0 else 1):  # warm-up (connections are set up on first use)
                t0 = time.perf_counter()
                dist.all_reduce(tensor)
                sync()
                warm = time.perf_counter() - t0
            share = max(0.0, time_left()) / (phases - step)
            iters = int(agree(max(1, min(args.max_iters, int(share / max(warm, 1e-6)))) if rank == 0 else 0.0))
            iters = max(1, iters)
            dist.barrier()
            times = []
            for _timed in range(iters):
                t0 = time.perf_counter()
                dist.all_reduce(tensor)
                sync()
                times.append(time.perf_counter() - t0)
            emit("allreduce", rank=rank, host=host, bytes=size, iters=iters, time_s=statistics.fmean(times),
                 max_s=max(times))
            del tensor

        if world > 1 and not truncated:
            send = torch.ones(args.exchange_bytes // 4, dtype=torch.float32, device=device)
            recv = torch.empty_like(send)
            for k in range(1, world):
                go = agree(1.0 if rank != 0 or time_left() > 0 else 0.0, dist.ReduceOp.MIN)
                if go < 1.0:
                    truncated = True
                    break
                to, frm = (rank + k) % world, (rank - k) % world
                times = []
                for _try in range(max(1, args.exchange_iters)):
                    dist.barrier()
                    t0 = time.perf_counter()
                    for request in (dist.isend(send, to), dist.irecv(recv, frm)):  # both posted, then waited
                        if request is not None:  # None only for a rank outside the group
                            request.wait()
                    sync()
                    times.append(time.perf_counter() - t0)
                emit("exchange", rank=rank, host=host, round=k, to=to, frm=frm, bytes=args.exchange_bytes,
                     time_s=min(times))  # the best try: contention only ever adds time
        dist.barrier()
    except Exception as exc:  # a peer that died or a broken link: say so on this rank's stream
        emit("error", kind="collective", rank=rank, host=host, detail=f"{type(exc).__name__}: {exc}")
        return 1
    emit("done", rank=rank, host=host, truncated=truncated, elapsed_s=time.monotonic() - started)
    try:
        dist.destroy_process_group()
    except Exception:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
