"""A fault-tolerant training script written for torchrun (torch.distributed.elastic).

It relies on what torchrun documents for every worker:

- the checkpoint is named after the job, TORCHELASTIC_RUN_ID, and is resumed
  when the worker group was restarted (TORCHELASTIC_RESTART_COUNT > 0);
- the per-worker batch is the global batch split across the role's workers
  (ROLE_WORLD_SIZE), and each node's first worker reports for the node
  (GROUP_RANK of GROUP_WORLD_SIZE);
- the errors of `main` are recorded for torchrun's error summary (@record).

    torchrun --standalone --nproc-per-node 2 elastic_checkpoint.py --steps 8
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

GLOBAL_BATCH = 64


def env_int(name):
    return int(os.environ[name])


@record
def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--checkpoint-dir", default="checkpoints")
    args = parser.parse_args()

    run_id = os.environ["TORCHELASTIC_RUN_ID"]
    restart_count = env_int("TORCHELASTIC_RESTART_COUNT")
    max_restarts = env_int("TORCHELASTIC_MAX_RESTARTS")
    role = os.environ["ROLE_NAME"]
    role_rank, role_world_size = env_int("ROLE_RANK"), env_int("ROLE_WORLD_SIZE")
    group_rank, group_world_size = env_int("GROUP_RANK"), env_int("GROUP_WORLD_SIZE")
    local_rank, local_world_size = env_int("LOCAL_RANK"), env_int("LOCAL_WORLD_SIZE")

    dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    assert (role_rank, role_world_size) == (rank, world_size), "one role spans the whole job"
    if local_rank == 0:
        print(f"node {group_rank}/{group_world_size}: {local_world_size} workers, role {role}, "
              f"attempt {restart_count + 1} of at most {max_restarts + 1}, "
              f"{torch.get_num_threads()} intra-op threads per worker")

    batch = GLOBAL_BATCH // role_world_size
    torch.manual_seed(1234)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)

    checkpoint = os.path.join(args.checkpoint_dir, f"{run_id}.pt")
    start = 0
    if restart_count > 0 and os.path.exists(checkpoint):
        state = torch.load(checkpoint)
        model.load_state_dict(state["model"])
        start = state["step"]
        print(f"rank {rank}: resuming {run_id} at step {start}")

    data = torch.Generator().manual_seed(rank)
    for _step in range(start, args.steps):
        x = torch.randn(batch, 16, generator=data)
        loss = (ddp(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    if rank == 0:
        os.makedirs(args.checkpoint_dir, exist_ok=True)
        torch.save({"model": model.state_dict(), "step": args.steps}, checkpoint)
        print(f"rank 0: saved {checkpoint}")
    total = sum(p.detach().double().sum().item() for p in model.parameters())
    print(f"rank {rank}/{world_size}: batch {batch}, parameter sum {total:.10f}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
