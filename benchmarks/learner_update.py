"""Seconds and model FLOP/s of one learner update (forward with grad, backward, clip, AdamW step) on long responses.

    .venv/bin/python benchmarks/learner_update.py --like runs/bench/m30/model --response-len 256

Builds a randomly initialised model with the configuration of ``--like``, makes 8 prompts
x K=8 responses of ``--response-len`` random tokens (what a random model samples, without
its occasional EOS), then times the learner update of
``GGPOModule`` on them through its public step pieces: ``pack`` (the module's layout) and
``step_loss`` (learner token log-probs with grad, the GGPO loss; the reference log-probs
come from the module's cache after the warm-up update, as in training), backward,
gradient-norm clip 1.0 and a fused AdamW step, under bf16 autocast or in fp32, one torch thread.

``model_flops_per_s = 6 * parameters * tokens / seconds``, where ``tokens`` counts the
token positions the learner actually processes (prompt copies included, padding not).
``benchmarks/vs_trl.py`` divides it by the machine's matmul peak.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--like", required=True, help="a model folder whose configuration (and tokenizer) to use")
    parser.add_argument("--response-len", type=int, default=256)
    parser.add_argument("--precisions", default="bf16,fp32")
    parser.add_argument("--repeat", type=int, default=3, help="timed updates per setting (after one warm-up)")
    parser.add_argument("--out", help="write the result JSON here")
    args = parser.parse_args()

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from ggpo_lightning.models.loading import load_tokenizer
    from ggpo_lightning.testing import make_group
    from ggpo_lightning.training.module import GGPOModule

    torch.set_num_threads(1)
    torch.manual_seed(0)
    tokenizer = load_tokenizer(args.like)
    config = AutoConfig.from_pretrained(args.like)
    config.max_position_embeddings = max(config.max_position_embeddings, 16 + args.response_len)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        AutoModelForCausalLM.from_config(config).save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        module = GGPOModule(tmp, verifier="numeric",
                            optimizer=lambda p: torch.optim.AdamW(p, lr=1e-5, weight_decay=0.0, fused=True))
        prompts = [module.group_rollout.encode(f"{11 * i}+{7 * i}=") for i in range(8)]
        # responses of exactly --response-len tokens, drawn uniformly from the ordinary tokens (no EOS): the
        # update's cost depends on the token count only, and sampling them would take longer than the update
        specials = set(tokenizer.all_special_ids)
        vocab = torch.tensor([t for t in range(len(tokenizer)) if t not in specials])
        groups = [make_group(p, vocab[torch.randint(len(vocab), (8, args.response_len))].tolist(),
                             [float(i % 2) for i in range(8)], prompt_id=str(n)) for n, p in enumerate(prompts)]
        optimizer = module.configure_optimizers()
        for precision in args.precisions.split(","):
            module.reference_cache.clear()
            batch = module.pack(groups)
            autocast = (torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16"
                        else contextlib.nullcontext())

            def update() -> float:
                start = time.perf_counter()
                with autocast:
                    loss, _ = module.step_loss(batch)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(module.learner.parameters(), 1.0)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                return time.perf_counter() - start

            update()  # warm-up: allocator, optimizer state, the reference log-probs cached
            seconds = statistics.median(update() for _ in range(args.repeat))
            packed = batch.packed
            tokens = int((packed.position_ids > 0).sum() + packed.position_ids.shape[0] if packed is not None
                         else batch.tokens)
            positions = int(packed.input_ids.numel() if packed is not None else batch.input_ids.numel())
            params = module.learner.num_parameters()
            run = {"precision": precision, "shared_prefix": packed is not None, "seconds": seconds, "tokens": tokens,
                   "positions_with_padding": positions, "parameters": params,
                   "response_tokens": sum(len(r) for g in groups for r in g.response_ids),
                   "model_flops_per_s": 6 * params * tokens / seconds}
            results.append(run)
            print(json.dumps(run), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"response_len": args.response_len, "runs": results}, indent=2))


if __name__ == "__main__":
    main()
