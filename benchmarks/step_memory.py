"""Peak memory of one training step, single pass vs micro-batched, as the batch grows.

Each point runs in a fresh process: a randomly initialised Qwen3-architecture model (default ~30M parameters,
a small vocabulary), its frozen reference copy, ``P`` prompts x K responses of ``--response-tokens`` random tokens,
one GGPO step (learner log-probs, reference log-probs, loss, backward) either in one pass or in micro-batches of
``--max-tokens`` padded tokens (:mod:`ggpo_lightning.core.microbatch`): as the trainer takes them (one forward per
response where every group fits whole in a micro-batch, K x (32 + response tokens) <= ``--max-tokens``; else two
passes), or with ``--passes two`` always in two passes, or ``--passes both`` a point of each (one pass against two
passes at the same budget). Printed per point: peak RSS minus the RSS
after loading the models (the step's own memory: activations, logits chunks, gradients), the step time, and beside
it the estimate that ``ggpo-train`` prints before the weights load (:mod:`ggpo_lightning.models.memory`: gradients
plus the activations of the largest micro-batch, CPU attention keeping its probabilities).

    python benchmarks/step_memory.py                        # P in 2 4 8, K=8, 256 tokens, ~30M parameters
    python benchmarks/step_memory.py --prompts 2 4 --hidden 64 --layers 2 --response-tokens 32   # a smoke run
    python benchmarks/step_memory.py --max-tokens 4608 --passes both   # one pass against two (K=8 x 288 fits)
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time


FORMS = {"whole": "no micro-batches", "one": "one pass", "two": "two passes"}
"""What a point's step took (``PendingStep.passes``)."""


def rss_mb() -> float:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS")) / 1024


def learner_and_reference(args: argparse.Namespace):
    """A randomly initialised Qwen3-architecture learner of ``args``' shape (``vocab``, ``hidden``, ``layers``; room for
    ``response_tokens`` after a prompt), in train mode, and its frozen reference copy; with the configuration."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=3 * args.hidden,
                         num_hidden_layers=args.layers, num_attention_heads=args.hidden // 64 or 1,
                         num_key_value_heads=max(1, args.hidden // 128), head_dim=64,
                         max_position_embeddings=args.response_tokens + 64, tie_word_embeddings=True)
    learner = Qwen3ForCausalLM(config).train()
    reference = Qwen3ForCausalLM(config).eval().requires_grad_(False)
    reference.load_state_dict(learner.state_dict())
    return config, learner, reference


def worker(args: argparse.Namespace) -> dict:
    import torch

    from dataclasses import replace

    from ggpo_lightning.core.batch import batch_token_logprobs, pack_step
    from ggpo_lightning.core.microbatch import StepPasses, plan_step, plan_whole_groups
    from ggpo_lightning.core.objectives import ObjectiveConfig, get_objective
    from ggpo_lightning.core.step_loss import StepLoss
    from ggpo_lightning.models.memory import estimate_memory, model_shape
    from ggpo_lightning.testing import make_group

    torch.set_num_threads(1)
    torch.manual_seed(0)
    prompts = args.prompts[0]
    config, learner, reference = learner_and_reference(args)
    groups = [make_group(torch.randint(4, args.vocab, (32,)).tolist(),
                         [torch.randint(4, args.vocab, (args.response_tokens,)).tolist() for _ in range(args.k)],
                         [float(i % 2) for i in range(args.k)], prompt_id=f"p{g}") for g in range(prompts)]
    batch = pack_step(groups, 0, torch.device("cpu"))
    objective = get_objective("ggpo")
    if args.passes == "two":  # declares nothing: two passes, as a plugin's objective
        objective = replace(objective, denominator=None)

    def reference_logprobs(b):
        with torch.no_grad():
            return batch_token_logprobs(reference, b, args.chunk)

    loss = StepLoss(objective, ObjectiveConfig(beta=0.04), 0.0, reference_logprobs)
    groups = plan_whole_groups(batch, args.max_tokens) if args.max_tokens and loss.declared else None
    plan = ([list(range(batch.input_ids.shape[0]))] if not args.max_tokens else plan_step(batch, args.max_tokens)
            if groups is None else [[r for g in part for r in batch.group_rows()[g]] for part in groups])
    width = int(batch.attention_mask.sum(-1).max())  # [B, L] rows: the longest (the attention's row on CPU)
    padded = max(len(rows) * int(batch.attention_mask[rows].sum(-1).max()) for rows in plan if rows)
    # the step allocates the gradients and one micro-batch's activations (models.memory)
    estimate = estimate_memory(model_shape(config), micro_batch_tokens=padded, logprob_chunk_size=args.chunk,
                               attention_row=width)
    base = rss_mb()
    start = time.perf_counter()
    pending = StepPasses(args.max_tokens or None, args.chunk).run(learner, batch, loss, lambda s: s.backward())
    pending.finish().backward()
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    parameters = sum(p.numel() for p in learner.parameters())
    return {"prompts": prompts, "max_tokens": args.max_tokens, "passes": pending.passes, "step_mb": round(peak - base, 1),
            "seconds": round(seconds, 2), "parameters_m": round(parameters / 1e6, 1),
            "tokens": int(batch.attention_mask.sum()),
            "estimate_mb": round((estimate.activations + estimate.gradients) / 2**20, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--response-tokens", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, default=2048, help="the micro-batched runs' budget")
    parser.add_argument("--passes", choices=("auto", "two", "both"), default="auto",
                        help="micro-batched points: as the trainer (one pass where whole groups fit), always two "
                             "passes, or one point of each")
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--chunk", type=int, default=4096)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return
    rows = []
    for prompts in args.prompts:
        forms = ("auto", "two") if args.passes == "both" else (args.passes,)
        for budget, passes in [(0, "auto")] + [(args.max_tokens, form) for form in forms]:
            command = [sys.executable, __file__, "--worker", "--prompts", str(prompts), "--k", str(args.k),
                       "--passes", passes,
                       "--response-tokens", str(args.response_tokens), "--max-tokens", str(budget),
                       "--hidden", str(args.hidden), "--layers", str(args.layers), "--vocab", str(args.vocab),
                       "--chunk", str(args.chunk)]
            result = subprocess.run(command, capture_output=True, text=True, check=True)
            rows.append(json.loads(result.stdout.strip().splitlines()[-1]))
            row = rows[-1]
            print(f"P={prompts:2d} K={args.k} {'one pass' if not budget else f'max_tokens {budget}':>16}: "
                  f"step memory {row['step_mb']:8.1f} MB, {row['seconds']:7.2f} s ({row['tokens']} tokens, "
                  f"{row['parameters_m']}M parameters, {FORMS[row['passes']]}); estimate {row['estimate_mb']:8.1f} MB "
                  f"(x{row['estimate_mb'] / max(row['step_mb'], 0.1):.2f} of measured)", flush=True)
    single = [r["step_mb"] for r in rows if not r["max_tokens"]]
    micro = [r["step_mb"] for r in rows if r["max_tokens"]]
    print(f"one pass: {min(single):.0f}..{max(single):.0f} MB (x{max(single) / max(min(single), 1e-9):.2f}); "
          f"micro-batched: {min(micro):.0f}..{max(micro):.0f} MB (x{max(micro) / max(min(micro), 1e-9):.2f})")


if __name__ == "__main__":
    main()
