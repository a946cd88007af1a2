"""fdl quickstart: a tiny model trained with DistributedDataParallel on every rank fdl starts.

fdl gives each rank the standard torch.distributed environment (MASTER_ADDR,
MASTER_PORT, WORLD_SIZE, RANK, LOCAL_RANK) plus FDL_BACKEND and FDL_DEVICE, so
this is an ordinary PyTorch script: no fdl import. Each rank trains a small
linear model on its own shard of synthetic data; DDP all-reduces the
gradients, so every rank keeps the same weights. At the end the ranks
all-reduce the weights once more and print a checksum of the result: every
rank must print the same one. gloo on CPU, nccl when the rank has a GPU.

    python train.py --steps 30            # under fdl: `fdl train` (see fdl.yml)

--fail-rank/--fail-step make one rank exit 1 mid-run (for trying out how the
launcher stops the others); --pause slows each step down so there is time to
watch `fdl status`.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
import warnings

with warnings.catch_warnings():  # torch's own note on a numpy-less box, printed while it loads
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30, help="training steps")
    parser.add_argument("--pause", type=float, default=0.0, help="seconds to sleep after each step")
    parser.add_argument("--fail-rank", type=int, default=-1, help="this rank exits 1 ...")
    parser.add_argument("--fail-step", type=int, default=-1, help="... after this step")
    opts = parser.parse_args()

    gpu = os.environ.get("FDL_BACKEND") == "nccl" and torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device(f"cuda:{local_rank}") if gpu else torch.device("cpu")
    if gpu:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if gpu else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    host = os.environ.get("FDL_HOST", "?")

    torch.manual_seed(0)  # the same initial weights everywhere (DDP would broadcast rank 0's anyway)
    model = torch.nn.Linear(8, 1).to(device)
    ddp = DistributedDataParallel(model, device_ids=[local_rank] if gpu else None)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(1000 + rank)  # each rank its own shard
    true_w = torch.arange(1.0, 9.0)

    loss = torch.tensor(0.0)
    for step in range(1, opts.steps + 1):
        x = torch.randn(64, 8, generator=data)
        y = (x @ true_w + 0.5).unsqueeze(1)
        loss = torch.nn.functional.mse_loss(ddp(x.to(device)), y.to(device))
        optimizer.zero_grad()
        loss.backward()  # gradients all-reduced across every rank here
        optimizer.step()
        if rank == opts.fail_rank and step == opts.fail_step:
            print(f"rank {rank}: failing on purpose after step {step}", flush=True)
            os._exit(1)  # at once, exit code 1: a live gloo group's destructors may abort (134) on a normal exit
        if opts.pause:
            time.sleep(opts.pause)

    with torch.no_grad():
        weights = torch.cat([p.detach().flatten() for p in model.parameters()]).double()
        dist.all_reduce(weights)
        weights /= world
    checksum = hashlib.sha256(repr(weights.cpu().tolist()).encode()).hexdigest()[:16]
    print(f"rank {rank}/{world} on {host}: {opts.steps} steps, loss {loss.item():.4f}, "
          f"weights checksum {checksum}", flush=True)
    dist.barrier()  # nobody tears the group down while a peer is still using it (gloo aborts otherwise)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
