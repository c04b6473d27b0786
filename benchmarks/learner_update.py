"""Seconds and model FLOP/s of one learner update (forward with grad, backward, clip, AdamW step) on long responses.

    .venv/bin/python benchmarks/learner_update.py --like runs/bench/m30/model --response-len 256 [--compile] [--peak]
    .venv/bin/python benchmarks/learner_update.py --like runs/bench/m30/model --shape qwen3-0.5b --prompts 2 \\
        --response-len 1024 --max-tokens 2100 --compile --peak   # two rows per micro-batch: 4096 needs ~31 GB

Builds a randomly initialised model with the configuration of ``--like`` (or, with ``--shape qwen3-0.5b``, Qwen3-0.6B's
decoder with a 32768-token vocabulary: 28 layers, hidden 1024, 16 query and 8 key-value heads of 128, intermediate
3072, tied embeddings; 0.47B parameters) and the tokenizer of ``--like``, makes ``--prompts`` prompts x K=8
responses of ``--response-len`` random tokens (what a random model samples, without its occasional EOS), then times
the learner update of ``GGPOModule`` on them through its public step pieces: ``pack`` (the module's layout) and
``passes`` (learner token log-probs with grad and the GGPO loss, in micro-batches of ``--max-tokens`` padded tokens
when given, as the trainer runs a step; the reference log-probs come from the module's cache after the warm-up
update, as in training), backward, gradient-norm clip 1.0 and a fused AdamW step, under bf16 autocast or in fp32,
one torch thread. With ``--compile`` the same after it with ``model.compile: true`` (a fresh module): the warm-up
update then holds the compiles, whose seconds and count are printed (``compile_seconds``, ``compiles``; and
``compiles_after_warm_up``, 0 once every width bucket has been seen).

``model_flops_per_s = 6 * parameters * tokens / seconds``, where ``tokens`` counts the
token positions the learner actually processes (prompt copies included, padding not: neither the layout's nor the
compiled forward's width buckets). ``--peak`` divides it by this machine's matmul peak of the run's precision
(``vs_trl.matmul_peak``); ``benchmarks/vs_trl.py`` does the same with its own measurement.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

SHAPES = {"qwen3-0.5b": dict(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                             head_dim=128, intermediate_size=3072, vocab_size=32768, tie_word_embeddings=True),
          "qwen3-toy": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                            head_dim=16, intermediate_size=128, vocab_size=512, tie_word_embeddings=True)}
"""``--shape``: Qwen3 configurations built instead of ``--like``'s (its tokenizer kept); ``qwen3-toy`` for smoke
runs."""


def measure(folder: str, args: argparse.Namespace, compiled: bool) -> list[dict]:
    """One run per precision of ``args.precisions``: the update of a ``GGPOModule`` of the model in ``folder`` (with
    ``model.compile`` when ``compiled``) on ``args.prompts`` x 8 random responses."""
    import torch

    from ggpo_lightning.core.microbatch import MicroBatchConfig
    from ggpo_lightning.models.compiled import compile_metrics
    from ggpo_lightning.testing import make_group
    from ggpo_lightning.training.module import GGPOModule

    module = GGPOModule(folder, verifier="numeric", micro_batch=MicroBatchConfig(args.max_tokens), compile=compiled,
                        optimizer=lambda p: torch.optim.AdamW(p, lr=1e-5, weight_decay=0.0, fused=True))
    # responses of exactly --response-len tokens, drawn uniformly from the ordinary tokens (no EOS): the
    # update's cost depends on the token count only, and sampling them would take longer than the update
    specials = set(module.tokenizer.all_special_ids)
    vocab = torch.tensor([t for t in range(len(module.tokenizer)) if t not in specials])
    prompts = [module.group_rollout.encode(f"{11 * i}+{7 * i}=") for i in range(args.prompts)]
    groups = [make_group(p, vocab[torch.randint(len(vocab), (8, args.response_len))].tolist(),
                         [float(i % 2) for i in range(8)], prompt_id=str(n)) for n, p in enumerate(prompts)]
    optimizer = module.configure_optimizers()
    runs = []
    for precision in args.precisions.split(","):
        module.reference_cache.clear()
        batch = module.pack(groups)
        autocast = torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16" else contextlib.nullcontext()

        def update() -> float:
            start = time.perf_counter()
            with autocast:  # the step as training_step runs it: whole, or micro-batched in one or two passes
                pending = module.passes.run(module.learner, batch, module.loss_terms(), lambda loss: loss.backward())
                last = pending.finish()
            last.backward()
            torch.nn.utils.clip_grad_norm_(module.learner.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            return time.perf_counter() - start

        before = compile_metrics()
        warm_up = update()  # allocator, optimizer state, the reference log-probs cached, the compiles
        after = compile_metrics()
        seconds = statistics.median(update() for _ in range(args.repeat))
        packed = batch.packed
        tokens = int((packed.position_ids > 0).sum() + packed.position_ids.shape[0] if packed is not None
                     else batch.tokens)
        positions = int(packed.input_ids.numel() if packed is not None else batch.input_ids.numel())
        params = module.learner.num_parameters()
        run = {"precision": precision, "compile": compiled, "shared_prefix": packed is not None,
               "max_tokens": args.max_tokens, "seconds": seconds, "warm_up_seconds": warm_up, "tokens": tokens,
               "positions_with_padding": positions, "parameters": params,
               "response_tokens": sum(len(r) for g in groups for r in g.response_ids),
               "model_flops_per_s": 6 * params * tokens / seconds}
        if compiled:
            run["compile_seconds"] = after["compile/seconds"] - before["compile/seconds"]
            run["compiles"] = after["compile/compiles"] - before["compile/compiles"]
            run["compiles_after_warm_up"] = compile_metrics()["compile/compiles"] - after["compile/compiles"]
        runs.append(run)
    return runs


def check_memory(config, args: argparse.Namespace) -> None:
    """Exit with one line, before any model is built, when the estimate of the update's memory
    (``ggpo_lightning.models.memory``, the learner's step with CPU attention keeping its probabilities; in fp32
    where fp32 is measured, its activations being twice bf16 autocast's) is above the host's available memory: the
    kernel would kill the run minutes in."""
    from ggpo_lightning.models.memory import GB, available_host_memory, estimate_memory, model_shape

    row = 64 + args.response_len  # a prompt's tokens and a response's, an upper bound
    step = 8 * args.prompts * row
    estimate = estimate_memory(model_shape(config),
                               precision="32-true" if "fp32" in args.precisions.split(",") else "bf16-mixed",
                               micro_batch_tokens=min(args.max_tokens or step, step), attention_row=row,
                               device_memory=available_host_memory(), device="the host's available memory")
    if not estimate.fits():
        sys.exit(f"learner_update.py: the update needs about {estimate.total / GB:.1f} GB (estimate; activations "
                 f"{estimate.activations / GB:.1f} GB per micro-batch of {estimate.micro_batch_tokens} tokens) of "
                 f"{estimate.device_memory / GB:.1f} GB available here: lower --max-tokens")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--like", required=True, help="a model folder whose configuration (and tokenizer) to use")
    parser.add_argument("--shape", choices=sorted(SHAPES), help="a Qwen3 shape instead of --like's configuration")
    parser.add_argument("--response-len", type=int, default=256)
    parser.add_argument("--prompts", type=int, default=8, help="prompt groups of K=8 responses")
    parser.add_argument("--max-tokens", type=int, help="model.micro_batch.max_tokens (default: the whole step)")
    parser.add_argument("--precisions", default="bf16,fp32")
    parser.add_argument("--repeat", type=int, default=3, help="timed updates per setting (after one warm-up)")
    parser.add_argument("--compile", action="store_true", help="also with model.compile: true, after the eager runs")
    parser.add_argument("--peak", action="store_true", help="also the share of this machine's matmul peak")
    parser.add_argument("--out", help="write the result JSON here")
    args = parser.parse_args()

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, Qwen3Config

    from ggpo_lightning.models.loading import load_tokenizer
    from vs_trl import matmul_peak

    torch.set_num_threads(1)
    torch.manual_seed(0)
    tokenizer = load_tokenizer(args.like)
    config = Qwen3Config(**SHAPES[args.shape]) if args.shape else AutoConfig.from_pretrained(args.like)
    config.max_position_embeddings = max(config.max_position_embeddings, 64 + args.response_len)
    check_memory(config, args)
    peaks = {p: matmul_peak("bfloat16" if p == "bf16" else "float32") for p in args.precisions.split(",")} \
        if args.peak else {}
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        AutoModelForCausalLM.from_config(config).save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        for compiled in (False, True) if args.compile else (False,):
            for run in measure(tmp, args, compiled):  # a module of its own, freed before the next
                if peaks:
                    run["share_of_matmul_peak"] = run["model_flops_per_s"] / peaks[run["precision"]]
                results.append(run)
                print(json.dumps(run), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"response_len": args.response_len, "shape": args.shape,
                                              "matmul_peak_flops": peaks, "runs": results}, indent=2))


if __name__ == "__main__":
    main()
