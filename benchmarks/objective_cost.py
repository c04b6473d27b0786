"""Seconds and peak memory of one learner update per objective, on one workload (issue 57's cost table).

Each objective runs in a fresh process, at its recipe's settings (``recipes/baselines/<name>.yaml``'s
``model.objective``; ``ggpo`` at the shipped defaults, its behavior anchor on as for stale rollouts): a randomly
initialised Qwen3-architecture model (default ~7M parameters, a 4096-token vocabulary), its frozen reference, and a
lagged behavior (the learner with every weight moved by N(0, 0.02^2)) whose token log-probs are recorded with
``--prompts`` x K=8 responses of ``--response-tokens`` random tokens. The update is the trainer's, in one process,
one torch thread: learner log-probs with grad, the reference's, the loss (the step's whole batch, or micro-batched
at ``--max-tokens``: one pass where the objective declares its denominator, two otherwise), backward, gradient-norm
clip 1.0, AdamW. Printed per objective: the median seconds of ``--repeat`` updates after one warm-up, the peak RSS
above the RSS once the models and the batch are built (``update_mb``: activations, gradients, AdamW's state), and
what the objective needs: behavior log-probs from the engine, one or two micro-batched passes.

    python benchmarks/objective_cost.py                                   # every baseline overlay and ggpo
    python benchmarks/objective_cost.py --objectives ggpo,oapl --hidden 64 --layers 1 --response-tokens 16  # smoke
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import yaml
from step_memory import learner_and_reference, rss_mb  # the same model and measure as the step benchmark

ROOT = Path(__file__).resolve().parents[1]
OBJECTIVES = "ggpo,grpo,grpo-tis,grpo-icepop,oapl,m2po,prime_rl,vespo"
"""The default rows: the shipped GGPO, GRPO and the corrections of the corrections grid, the lagged-data family."""


def objective_settings(name: str) -> dict:
    """``model.objective`` as a user runs ``name``: its overlay under ``recipes/baselines/``, or GGPO's defaults."""
    if name == "ggpo":
        return {"name": "ggpo"}
    overlay = ROOT / "recipes" / "baselines" / f"{name}.yaml"
    if not overlay.is_file():
        sys.exit(f"objective_cost.py: --objectives: no recipe {overlay.relative_to(ROOT)} for {name!r}")
    return yaml.safe_load(overlay.read_text())["model"]["objective"]


def worker(args: argparse.Namespace) -> dict:
    import torch
    from transformers import Qwen3ForCausalLM

    from ggpo_lightning.core.batch import batch_token_logprobs, pack_step
    from ggpo_lightning.core.microbatch import StepPasses
    from ggpo_lightning.core.objectives import ObjectiveConfig, get_objective
    from ggpo_lightning.core.step_loss import StepLoss
    from ggpo_lightning.testing import make_group

    torch.set_num_threads(1)
    torch.manual_seed(0)
    settings = ObjectiveConfig(**objective_settings(args.worker))
    objective = get_objective(settings.name)
    config, learner, reference = learner_and_reference(args)
    behavior = Qwen3ForCausalLM(config).eval().requires_grad_(False)
    with torch.no_grad():
        for mine, theirs in zip(behavior.parameters(), learner.parameters()):
            mine.copy_(theirs + 0.02 * torch.randn_like(theirs))
    groups = [make_group(torch.randint(4, args.vocab, (32,)).tolist(),
                         [torch.randint(4, args.vocab, (args.response_tokens,)).tolist() for _ in range(8)],
                         [float(i % 3 == 0) for i in range(8)], prompt_id=f"p{g}") for g in range(args.prompts)]
    with torch.no_grad():  # what the engine records while sampling: the behavior's log-prob of each response token
        recorded = batch_token_logprobs(behavior, pack_step(groups, 0, torch.device("cpu")), args.chunk)  # [B, L]
    rows = iter(recorded[:, -args.response_tokens:].tolist())  # responses of one length: the last columns
    groups = [replace(group, behavior_logprobs=[next(rows) for _ in range(group.k)]) for group in groups]
    batch = pack_step(groups, 0, torch.device("cpu"), require_behavior_logp=True)
    del behavior

    def reference_logprobs(part):
        with torch.no_grad():
            return batch_token_logprobs(reference, part, args.chunk)  # [b, l]

    loss = StepLoss(objective, settings, settings.anchor_weight(63), reference_logprobs)  # stale: sync every 64
    passes = StepPasses(args.max_tokens or None, args.chunk)
    optimizer = torch.optim.AdamW(learner.parameters(), lr=1e-5, weight_decay=0.0)
    base = rss_mb()

    def update() -> tuple[float, str]:
        start = time.perf_counter()
        pending = passes.run(learner, batch, loss, lambda value: value.backward())
        pending.finish().backward()
        torch.nn.utils.clip_grad_norm_(learner.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - start, pending.passes

    update()  # AdamW's state, the allocator
    timed = [update() for _ in range(args.repeat)]
    seconds = [s for s, _ in timed]
    return {"objective": args.worker, "seconds": round(statistics.median(seconds), 3),
            "seconds_min": round(min(seconds), 3), "seconds_max": round(max(seconds), 3),
            "update_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - base, 1),
            "passes": timed[-1][1], "behavior_logprobs": objective.uses_behavior_logp,
            "declares_denominator": objective.denominator is not None,
            "parameters_m": round(sum(p.numel() for p in learner.parameters()) / 1e6, 2),
            "tokens": int(batch.attention_mask.sum()), "anchor": loss.anchor_weight}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objectives", default=OBJECTIVES, help="comma-separated: ggpo or baseline overlay stems")
    parser.add_argument("--prompts", type=int, default=8, help="prompt groups of K=8 responses")
    parser.add_argument("--response-tokens", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=0, help="model.micro_batch.max_tokens (0: the whole step)")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--chunk", type=int, default=4096)
    parser.add_argument("--repeat", type=int, default=5, help="timed updates per objective (after one warm-up)")
    parser.add_argument("--out", help="write the rows as JSON here")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return
    names = [n.strip() for n in args.objectives.split(",") if n.strip()]
    for name in names:
        objective_settings(name)  # every name checked before the first measurement
    rows = []
    for name in names:
        command = [sys.executable, __file__, "--worker", name] + [
            f"--{key.replace('_', '-')}={getattr(args, key)}" for key in
            ("prompts", "response_tokens", "max_tokens", "hidden", "layers", "vocab", "chunk", "repeat")]
        result = subprocess.run(command, capture_output=True, text=True, timeout=1800)
        if result.returncode:
            sys.exit(f"objective_cost.py: {name} failed (exit {result.returncode}): {result.stderr.strip()[-800:]}")
        rows.append(json.loads(result.stdout.strip().splitlines()[-1]))
        row = rows[-1]
        print(f"{name:>12}: {row['seconds']:.3f} s per update ({row['seconds_min']:.3f}-{row['seconds_max']:.3f}), "
              f"update memory {row['update_mb']:.1f} MB, {row['passes']} pass(es), behavior log-probs "
              f"{'yes' if row['behavior_logprobs'] else 'no'}, anchor {row['anchor']:g} "
              f"({row['parameters_m']}M parameters, {row['tokens']} tokens)", flush=True)
    first = rows[0]
    print("relative to " + first["objective"] + ": " + ", ".join(
        f"{r['objective']} x{r['seconds'] / first['seconds']:.2f} s, x{r['update_mb'] / max(first['update_mb'], 0.1):.2f} MB"
        for r in rows[1:]))
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
