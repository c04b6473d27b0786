"""The HF engine's rollout with the behavior log-probs recorded while sampling, against a scoring forward after it.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/rollout_logprobs.py                 # m30 shape, 8 x 8, 16 tokens
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/rollout_logprobs.py --hidden-size 128 --num-layers 4 --model DIR

Builds a Llama of the given size with random weights (default the 33.6M-parameter ``m30`` shape of
docs/PERFORMANCE.md; nothing downloaded) or loads ``--model``, then times, one torch thread, per
round of ``--prompts`` prompts x ``--k`` samples (alternating the three, ``--rounds`` each, medians):

* ``sample only``: ``generate`` without log-probs (the floor);
* ``recorded``: ``generate`` with :class:`~ggpo_lightning.rollouts.hf.engine.SampledTokenLogprobs`
  (what the engine does now);
* ``scored``: ``generate``, then one forward over prompt + response
  (:func:`~ggpo_lightning.core.logprobs.response_token_logprobs`: what the engine did before).

Prints seconds per round and each one's overhead over sampling alone, and the largest difference
between the recorded and scored log-probs of the same responses (fp32: float tolerance).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a causal LM folder (default: a random Llama of the size below)")
    parser.add_argument("--hidden-size", type=int, default=512)
    parser.add_argument("--num-layers", type=int, default=8)
    parser.add_argument("--num-heads", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    args = parser.parse_args()

    import torch

    from ggpo_lightning.core.logprobs import response_token_logprobs
    from ggpo_lightning.models.loading import load_causal_lm, load_tokenizer
    from ggpo_lightning.rollouts.hf.engine import sample_responses
    from ggpo_lightning.tasks.arithmetic import ArithmeticTask
    from ggpo_lightning.tasks.tiny_model import TinyModelConfig, build_tiny_model

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model or str(build_tiny_model(Path(tmp) / "model", TinyModelConfig(
            hidden_size=args.hidden_size, num_layers=args.num_layers, num_heads=args.num_heads, sft_steps=0,
            max_position_embeddings=64 + args.max_new_tokens)))
        model = load_causal_lm(model_dir, dtype=args.dtype).eval()
        tokenizer = load_tokenizer(model_dir)
    task = ArithmeticTask(max_operand=99, ops="+")
    prompts = [tokenizer(row["prompt"])["input_ids"] for row in task.problems(args.prompts, seed=0)]
    decoding = dict(do_sample=True, temperature=1.0, top_p=1.0, top_k=0)

    def sample_only():
        return sample_responses(model, tokenizer, prompts, args.max_new_tokens, args.k, **decoding)

    def recorded():
        return sample_responses(model, tokenizer, prompts, args.max_new_tokens, args.k, record_logprobs=True,
                                **decoding)

    def scored():
        responses = sample_responses(model, tokenizer, prompts, args.max_new_tokens, args.k, **decoding).responses
        repeated = [p for p in prompts for _ in range(args.k)]
        with torch.no_grad():
            return responses, response_token_logprobs(model, repeated, responses, tokenizer.pad_token_id)

    ways = {"sample only": sample_only, "recorded": recorded, "scored": scored}
    times: dict[str, list[float]] = {name: [] for name in ways}
    tokens = 0
    for fn in ways.values():
        fn()  # warm-up
    for _ in range(args.rounds):
        for name, fn in ways.items():
            start = time.perf_counter()
            responses = fn()[0]
            times[name].append(time.perf_counter() - start)
            tokens = sum(len(r) for r in responses)
    torch.manual_seed(0)
    responses, logprobs, _ = recorded()
    repeated = [p for p in prompts for _ in range(args.k)]
    with torch.no_grad():
        reference = response_token_logprobs(model, repeated, responses, tokenizer.pad_token_id)
    gap = max(abs(a - b) for row, ref in zip(logprobs, reference) for a, b in zip(row, ref))

    parameters = sum(p.numel() for p in model.parameters())
    print(f"rollout of {args.prompts} prompts x K={args.k}, <= {args.max_new_tokens} new tokens, "
          f"{parameters / 1e6:.1f}M parameters, {args.dtype}, one thread, {args.rounds} rounds (medians); "
          f"~{tokens} response tokens per round")
    floor = statistics.median(times["sample only"])
    for name, seconds in times.items():
        median = statistics.median(seconds)
        print(f"  {name:12s} {median:7.3f} s/round  {100 * (median / floor - 1):+6.1f}% over sampling alone")
    print(f"  scored / recorded: {statistics.median(times['scored']) / statistics.median(times['recorded']):.2f}x")
    print(f"  max |recorded - scored| log-prob: {gap:.2e}")


if __name__ == "__main__":
    main()
