"""How much of a bf16 push changes between two syncs (issue 56, item 4): the share of the learner's weights whose bf16
value differs after 1, 4 and 16 optimizer updates, and what a delta push (the changed elements' int32 indices and
bf16 values) would send against the full bf16 push.

    HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 .venv/bin/python benchmarks/push_delta.py --models tiny m30 qwen3-0.5b

Per model (``tiny``, ``m30``: the workload's; ``qwen3-0.5b``: the Qwen3-shaped model of ``vllm_servers.py``; random
weights) and learning rate (``--lrs``: the quickstart's 1e-4 and the Qwen3 recipes' 1e-6), AdamW (the recipes'
optimizer, no weight decay) updates the fp32 learner on random token batches (``--batch`` x ``--tokens``, plain
next-token loss: an update's size under AdamW hardly depends on the loss); after 1, 4 and 16 updates the bf16 cast
of every weight is compared with the cast before the first. Also timed: finding the changed elements on this CPU
(``ne`` + ``nonzero`` over the model), the work a delta push adds on the trainer per sync.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vllm_servers import PUSH_MODELS, model_folder

from ggpo_lightning.models.loading import load_causal_lm

SYNC_EVERY = (1, 4, 16)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", choices=PUSH_MODELS, default=list(PUSH_MODELS))
    parser.add_argument("--lrs", nargs="+", type=float, default=[1e-4, 1e-6])
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--work", type=Path, help="model folders (default: a temporary folder)")
    return parser.parse_args(argv)


def bf16(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().to(torch.bfloat16) for name, tensor in model.state_dict().items()}


def measure(folder: Path, lr: float, batch: int, tokens: int) -> dict:
    torch.manual_seed(0)
    model = load_causal_lm(folder, dtype="float32").train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    before = bf16(model)
    total = sum(t.numel() for t in before.values())
    shares, seconds = {}, []
    for step in range(1, max(SYNC_EVERY) + 1):
        ids = torch.randint(0, model.config.vocab_size, (batch, tokens))
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step in SYNC_EVERY:
            after = bf16(model)
            start = time.perf_counter()
            changed = sum(int(torch.ne(after[n], before[n]).flatten().nonzero().numel()) for n in before)
            seconds.append(time.perf_counter() - start)
            shares[step] = changed / total
    return {"elements": total, "shares": shares, "diff_s": min(seconds)}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="ggpo-push-delta-") as scratch:
        root = args.work or Path(scratch)
        root.mkdir(parents=True, exist_ok=True)
        print(f"AdamW, batches of {args.batch} x {args.tokens} random tokens; OMP_NUM_THREADS="
              f"{os.environ['OMP_NUM_THREADS']}, load average {os.getloadavg()[0]:.2f}", flush=True)
        print("\n| model | lr | bf16 elements | changed after " + " | ".join(f"{k} update(s)" for k in SYNC_EVERY)
              + " | delta / full bytes at " + ", ".join(str(k) for k in SYNC_EVERY) + " | finding them s |\n|"
              + "---|" * (5 + len(SYNC_EVERY)))
        for name in args.models:
            folder = model_folder(root, name)
            for lr in args.lrs:
                m = measure(folder, lr, args.batch, args.tokens)
                shares = [m["shares"][k] for k in SYNC_EVERY]
                ratios = ", ".join(f"{share * 3:.2f}" for share in shares)  # (4 + 2) bytes per change, 2 per element
                print(f"| {name} | {lr:g} | {m['elements'] / 1e6:.1f}M | "
                      + " | ".join(f"{100 * share:.1f}%" for share in shares) + f" | {ratios} | {m['diff_s']:.2f} |",
                      flush=True)


if __name__ == "__main__":
    main()
