"""Peak memory per trainer rank at a weight push under FSDP2, before and after issue 55 (item 3) / 56 (item 1): two
gloo processes on CPU shard a model (``fully_shard``), then run a push's trainer side without servers.

    HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 .venv/bin/python benchmarks/push_memory.py --model qwen3-0.5b

- ``materialised`` (before): every rank gathers every tensor into a list in the serving dtype (the whole model), rank
  0 then reads it (as its send would); the others throw it away.
- ``streamed`` (now, :class:`~ggpo_lightning.rollouts.fleet.push.StreamedWeights`): rank 0 reads one pass, each
  tensor gathered and cast as the pass reaches it and copied into one of two packed buckets of
  ``--bucket-mib`` (what ``ggpo_gloo`` sends from); the others take part in the gathers and keep nothing.

Per rank: the peak resident memory (``VmHWM``, reset just before the push through ``/proc/self/clear_refs``) above
the resident memory before it, in MB; the model's size in the serving dtype for scale. Each design runs in fresh
processes.
"""

from __future__ import annotations

import argparse
import functools
import os
import socket
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vllm_servers import PUSH_MODELS, model_folder

from ggpo_lightning.models.loading import load_causal_lm
from ggpo_lightning.rollouts.fleet.push import StreamedWeights


def _kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def _push(rank: int, design: str, folder: str, dtype: torch.dtype, bucket_bytes: int) -> float:
    from torch.distributed.fsdp import fully_shard

    model = load_causal_lm(folder, dtype="float32")
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    dist.barrier()
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    before = _kb("VmRSS")
    source = StreamedWeights.of(model, dtype)
    if design == "materialised":
        pairs = list(source)
        if rank == 0:
            _ = sum(float(t.view(-1)[0]) for _, t in pairs)
        del pairs
    elif rank == 0:
        buffers = [torch.empty(bucket_bytes, dtype=torch.uint8) for _ in range(2)]
        used, k = 0, 0
        for _, tensor in source:
            flat = tensor.contiguous().view(-1).view(torch.uint8)
            if used + flat.numel() > bucket_bytes:
                k, used = k + 1, 0
            if flat.numel() <= bucket_bytes:
                buffers[k % 2][used:used + flat.numel()].copy_(flat)
                used += flat.numel()
    else:
        source.take_part_in_gathers()
    dist.barrier()
    return (_kb("VmHWM") - before) / 1e3


def _worker(rank: int, port: int, design: str, folder: str, dtype: torch.dtype, bucket_bytes: int, out) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        out[rank] = _push(rank, design, folder, dtype, bucket_bytes)
    finally:
        dist.destroy_process_group()


def on_two_ranks(design: str, folder: str, dtype: torch.dtype, bucket_bytes: int) -> list[float]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = mp.Manager().dict()
    mp.spawn(functools.partial(_worker), args=(port, design, folder, dtype, bucket_bytes, out), nprocs=2, join=True)
    return [out[0], out[1]]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=PUSH_MODELS, default="m30")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="bfloat16", help="the serving dtype")
    parser.add_argument("--bucket-mib", type=int, default=128)
    parser.add_argument("--work", type=Path)
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    dtype = getattr(torch, args.dtype)
    with tempfile.TemporaryDirectory(prefix="ggpo-push-memory-") as scratch:
        folder = model_folder(args.work or Path(scratch), args.model)
        model = load_causal_lm(folder, dtype="float32")
        size = sum(t.numel() for t in model.state_dict().values()) * dtype.itemsize / 1e6
        del model
        print(f"{args.model}: state dict {size:.0f} MB in {args.dtype}; two FSDP2 ranks on gloo, CPU")
        print("\n| design | rank 0 peak above before, MB | rank 1 peak above before, MB |\n|---|---|---|")
        for design in ("materialised", "streamed"):
            peaks = on_two_ranks(design, str(folder), dtype, args.bucket_mib << 20)
            print(f"| {design} | {peaks[0]:.0f} | {peaks[1]:.0f} |", flush=True)


if __name__ == "__main__":
    main()
