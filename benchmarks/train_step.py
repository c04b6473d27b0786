"""Tokens/s and peak memory of one GGPO training step and one rollout round.

    .venv/bin/python benchmarks/train_step.py                          # tiny Llama, 128 wide, 4 layers
    .venv/bin/python benchmarks/train_step.py --hidden-size 512 --num-layers 8 --groups 16
    .venv/bin/python benchmarks/train_step.py --model /path/to/hf-model --precision bf16 --device cuda

A model given by ``--model`` is loaded as it is; otherwise a Llama-style model of the
given size is built locally with random weights (no warm-up, nothing downloaded).
Each phase runs in a fresh process (spawn), so its peak memory is its own:

* ``rollout``: the module's ``group_rollout`` on ``--groups`` prompts x ``--k`` responses of
  at most ``--response-len`` tokens (sampling with the behavior log-probs, KV cache, verifier
  included);
* ``train step``: the same groups through the module's ``pack`` and ``step_loss`` (learner
  with grad, reference without: cached per group after the warm-up step, as in training),
  backward and one AdamW update; ``--repeat`` timed steps after one warm-up step.

Peak memory is ``torch.cuda.max_memory_allocated`` on CUDA and the process's peak RSS
above its RSS after set-up on CPU. Figures on a shared machine are noisy: compare
configurations within one run.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import resource
import tempfile
import time
from pathlib import Path


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def _phase(args: argparse.Namespace, model_dir: str, phase: str, queue: mp.Queue) -> None:
    import torch

    from ggpo_lightning.records.prompts import PromptRow
    from ggpo_lightning.training.module import GGPOModule
    from ggpo_lightning.rollouts.config import RolloutConfig, SamplingConfig
    from ggpo_verifiers import get_verifier

    torch.manual_seed(0)
    device = torch.device(args.device)
    sampling = SamplingConfig(max_new_tokens=args.response_len, generation_batch_size=args.groups * args.k)
    module = GGPOModule(model_dir, verifier="numeric", rollout=RolloutConfig(k=args.k, sampling=sampling),
                        gradient_checkpointing=args.gradient_checkpointing,
                        optimizer=lambda p: torch.optim.AdamW(p, lr=1e-5)).to(device)
    module.engine.to(device)
    module.group_rollout.verifier = get_verifier("numeric")
    prompt = "1+2=" * max(1, args.prompt_len // 4)
    rows = [PromptRow(f"p{i}", prompt, "3") for i in range(args.groups)]
    autocast = (torch.autocast(device.type, dtype=torch.bfloat16) if args.precision == "bf16"
                else contextlib.nullcontext())
    groups = module.group_rollout(rows)  # also the input of the train step
    optimizer = module.configure_optimizers()

    def train_step() -> int:
        batch = module.pack(groups)
        with autocast:
            loss, _ = module.step_loss(batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return batch.tokens

    def run_once() -> int:
        if phase == "rollout":
            return sum(len(ids) for g in module.group_rollout(rows) for ids in g.response_ids)
        return train_step()

    run_once()  # warm-up: allocator, kernels, optimizer state
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    base = _rss_bytes()
    start, tokens = time.perf_counter(), 0
    for _ in range(args.repeat):
        tokens += run_once()
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated() if device.type == "cuda" else max(0, _peak_rss_bytes() - base)
    module.group_rollout.verifier.close()
    queue.put({"phase": phase, "seconds": seconds / args.repeat, "tokens": tokens / args.repeat,
               "peak_bytes": peak, "parameters": module.learner.num_parameters()})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a transformers causal LM folder or hub id (default: build one locally)")
    parser.add_argument("--hidden-size", type=int, default=128)
    parser.add_argument("--num-layers", type=int, default=4)
    parser.add_argument("--num-heads", type=int, default=4)
    parser.add_argument("--groups", type=int, default=8, help="prompts per step (G)")
    parser.add_argument("--k", type=int, default=8, help="responses per prompt (K)")
    parser.add_argument("--prompt-len", type=int, default=16, help="prompt length in characters (tiny tokenizer)")
    parser.add_argument("--response-len", type=int, default=32, help="max new tokens per response")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32", help="train step autocast")
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeat", type=int, default=3, help="timed repetitions per phase")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model
        if model_dir is None:
            from ggpo_lightning.tasks.tiny_model import TinyModelConfig, build_tiny_model

            config = TinyModelConfig(hidden_size=args.hidden_size, num_layers=args.num_layers,
                                     num_heads=args.num_heads, sft_steps=0,
                                     max_position_embeddings=args.prompt_len + args.response_len + 8)
            model_dir = str(build_tiny_model(Path(tmp) / "model", config))
        ctx = mp.get_context("spawn")
        results = []
        for phase in ("rollout", "train step"):
            queue = ctx.Queue()
            proc = ctx.Process(target=_phase, args=(args, model_dir, phase, queue))
            proc.start()
            proc.join()  # the result is a small dict: the queue's feeder thread never blocks the exit
            if proc.exitcode:
                raise SystemExit(f"{phase} failed with exit code {proc.exitcode}")
            results.append(queue.get())
    print(f"model: {args.model or f'Llama {args.hidden_size}x{args.num_layers}'}, "
          f"{results[0]['parameters']:,} parameters; G={args.groups}, K={args.k}, "
          f"response <= {args.response_len} tokens, {args.precision}, {args.device}")
    print(f"{'phase':<12}{'seconds':>10}{'tokens':>10}{'tokens/s':>12}{'peak MiB':>11}")
    for r in results:
        print(f"{r['phase']:<12}{r['seconds']:>10.3f}{r['tokens']:>10.0f}{r['tokens'] / r['seconds']:>12.0f}"
              f"{r['peak_bytes'] / 2**20:>11.1f}")
    print("rollout tokens = generated response tokens; train-step tokens = prompt + response tokens "
          "through learner and reference")


if __name__ == "__main__":
    main()
