"""All-reduce time and bandwidth of torch.distributed (gloo on CPU, NCCL on GPUs), printed as
the same JSON lines `ferrotrain bench-collective` prints, for bench/collectives.sh.

    python bench/collectives_torch.py --backend gloo --world 2 --sizes-mb 4,40,400

Each of `--world` processes (spawned here) all-reduces float32 buffers of each size: `--warmup`
untimed calls, then `--iters` timed ones, each after a barrier so all start together; rank 0
prints the median. Bus bandwidth = algbw * 2(n-1)/n, as nccl-tests counts it.
"""

import argparse
import json
import os
import socket
import statistics
import time
import warnings

# The venv has no numpy; torch warns about it on import and nothing here needs it.
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank, args, port):
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // args.world))
    device = torch.device("cpu")
    if args.backend == "nccl":
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    dist.init_process_group(
        args.backend,
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=args.world,
    )
    for mb in args.sizes_mb:
        nbytes = int(mb * 1e6)
        t = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=device)
        times = []
        for i in range(args.warmup + args.iters):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(t)
            if device.type == "cuda":
                torch.cuda.synchronize()
            if i >= args.warmup:
                times.append(time.perf_counter() - t0)
        seconds = statistics.median(times)
        algbw = nbytes / seconds / 1e9
        if rank == 0:
            print(
                json.dumps(
                    {
                        "backend": args.backend,
                        "world": args.world,
                        "bytes": nbytes,
                        "seconds": seconds,
                        "min_seconds": min(times),
                        "algbw_gbps": algbw,
                        "busbw_gbps": algbw * 2 * (args.world - 1) / args.world,
                    }
                ),
                flush=True,
            )
    dist.barrier()
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--backend", default="gloo", choices=["gloo", "nccl"])
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--sizes-mb", default="4,16,40,100,400")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--iters", type=int, default=10)
    args = p.parse_args()
    args.sizes_mb = [float(s) for s in args.sizes_mb.split(",")]
    mp.spawn(worker, args=(args, free_port()), nprocs=args.world, join=True)


if __name__ == "__main__":
    main()
