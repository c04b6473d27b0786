"""The trainer-to-server wire of a weight push on GPUs, without vLLM (issue 56): a model's state dict in bf16, packed
into buckets as the push packs them (consecutive tensors, ``--bucket-mib`` each, two send and two receive buffers
kept), broadcast from one process to another over NCCL, each on its own GPU.

    python benchmarks/nccl_push.py --hidden 2048 --layers 28 --intermediate 6144 --vocab 151936   # Qwen3-1.7B's shape
    python benchmarks/nccl_push.py --backend gloo --device cpu --layers 4                          # a dry run on CPU

Prints per round the seconds of the whole push (pack + broadcast, bucket i+1 packed while bucket i is in flight)
and of the packing alone (the same copies, no wire), then the median and min-max of ``--rounds`` after one warm-up
and the GB/s. It measures the wire and the packing only: no gather (one process holds the whole model), no server
loading the weights (vLLM is not installed on the GPU machine). With one GPU, NCCL cannot join two processes on it:
the packing alone is timed.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--intermediate", type=int, default=6144)
    parser.add_argument("--kv-dim", type=int, default=1024, help="key-value heads x head size")
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--bucket-mib", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--backend", choices=("nccl", "gloo"), default="nccl")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    return parser.parse_args(argv)


def shapes(args: argparse.Namespace) -> list[tuple[int, ...]]:
    """A decoder's state dict, in order: embedding, per layer attention and MLP projections and norms, final norm."""
    h, i, kv = args.hidden, args.intermediate, args.kv_dim
    layer = [(h, h), (kv, h), (kv, h), (h, h), (i, h), (i, h), (h, i), (h,), (h,)]
    return [(args.vocab, h)] + layer * args.layers + [(h,)]


def buckets(sizes: list[int], bucket_bytes: int) -> list[list[int]]:
    """Indices of consecutive tensors per bucket (a tensor larger than a bucket is one of its own)."""
    out: list[list[int]] = []
    used = 0
    for index, size in enumerate(sizes):
        if out and used + size <= bucket_bytes:
            out[-1].append(index)
            used += size
        else:
            out.append([index])
            used = size
    return out


def push(tensors: list[torch.Tensor], plan: list[list[int]], buffers: list[torch.Tensor], group, send: bool) -> None:
    """Bucket by bucket: pack bucket k into buffer k % 2 while bucket k-1 is in flight, then broadcast it."""
    works: list = [None, None]
    for k, bucket in enumerate(plan):
        buffer = buffers[k % 2]
        if works[k % 2] is not None:
            works[k % 2].wait()
        offset = 0
        for index in bucket:
            flat = tensors[index].view(-1).view(torch.uint8)
            buffer[offset:offset + flat.numel()].copy_(flat)
            offset += flat.numel()
        if send:
            works[k % 2] = dist.broadcast(buffer[:offset], src=0, group=group, async_op=True)
    for work in works:
        if work is not None:
            work.wait()
    if buffers[0].is_cuda:
        torch.cuda.synchronize()


def _rank(rank: int, port: int, args: argparse.Namespace, out) -> None:
    device = torch.device(args.device, rank) if args.device == "cuda" else torch.device("cpu")
    if args.device == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(args.backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        out[rank] = _timed(rank, args, device, send=True)
    finally:
        dist.destroy_process_group()


def _timed(rank: int, args: argparse.Namespace, device: torch.device, send: bool) -> dict:
    tensors = [torch.randn(shape, dtype=torch.bfloat16, device=device) for shape in shapes(args)]
    sizes = [t.numel() * t.element_size() for t in tensors]
    plan = buckets(sizes, args.bucket_mib << 20)
    largest = max(sum(sizes[i] for i in bucket) for bucket in plan)
    buffers = [torch.empty(largest, dtype=torch.uint8, device=device) for _ in range(2)]
    seconds = {"push": [], "packing": []}
    for r in range(args.rounds + 1):
        for kind, sending in (("push", send), ("packing", False)):
            if sending:
                dist.barrier()
            start = time.perf_counter()
            if rank == 0 or not sending:
                push(tensors, plan, buffers, None, sending)
            else:  # the receiver: each bucket into one of its two kept buffers
                for k, bucket in enumerate(plan):
                    size = sum(sizes[i] for i in bucket)
                    dist.broadcast(buffers[k % 2][:size], src=0)
                if device.type == "cuda":
                    torch.cuda.synchronize()
            if r:
                seconds[kind].append(time.perf_counter() - start)
            if not send:
                break
    return {"bytes": sum(sizes), "buckets": len(plan), "seconds": seconds}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    two = args.device == "cpu" or torch.cuda.device_count() >= 2
    if two:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        out = mp.Manager().dict()
        mp.spawn(_rank, args=(port, args, out), nprocs=2, join=True)
        result = dict(out[0])
    else:
        result = _timed(0, args, torch.device("cuda", 0), send=False)
        result["note"] = "one GPU: NCCL cannot join two processes on it; the packing alone"
    gb = result["bytes"] / 1e9
    for kind, values in result["seconds"].items():
        if values:
            result[f"{kind}_median_s"] = statistics.median(values)
            result[f"{kind}_gb_per_s"] = gb / statistics.median(values)
            print(f"nccl_push: {kind} of {gb:.2f} GB in {result['buckets']} buckets: {statistics.median(values):.3f} s "
                  f"({min(values):.3f}-{max(values):.3f}), {gb / statistics.median(values):.1f} GB/s "
                  f"[{args.backend}, {args.device}]")
    print(json.dumps({k: v for k, v in result.items() if k != "seconds"}))


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
