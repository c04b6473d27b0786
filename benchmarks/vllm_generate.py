"""Generate throughput of the vLLM rollout engine against the HF engine, on the same model and workload.

    HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 .venv-vllm/bin/python benchmarks/vllm_generate.py
    .venv-vllm/bin/python benchmarks/vllm_generate.py --dtype float32 --rounds 7 --max-new-tokens 64

Runs in the vLLM venv (``make setup-vllm``). Builds a Llama of the given size with random
weights (default 512 wide, 8 layers, 8 heads: the 33.6M-parameter benchmark model ``m30``
of docs/PERFORMANCE.md; nothing downloaded, no warm-up: a random model rarely stops early,
so every response runs to ``--max-new-tokens``), then times ``engine.generate`` of
``--prompts`` prompts x ``--k`` samples at temperature 1 with
:class:`~ggpo_lightning.rollouts.hf.engine.HFGenerateEngine` (transformers ``generate``, one
prompt KV cache per group) and :class:`~ggpo_lightning.rollouts.vllm.engine.VLLMEngine` (vLLM
colocated, in-process), both in ``--dtype`` and without recording log-probs. One
untimed round each first (vLLM's first call compiles and allocates); then ``--rounds``
timed rounds, alternating which engine goes first. Prints per engine the median seconds
per round, response tokens/s, the torch threads it ran with, and the ratio HF / vLLM
(> 1: vLLM faster). On a shared machine absolute times drift; read the ratio of one run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from ggpo_lightning.models.loading import load_causal_lm, load_tokenizer
from ggpo_lightning.rollouts.config import DTYPES, SamplingConfig
from ggpo_lightning.rollouts.protocol import RolloutEngine
from ggpo_lightning.rollouts.hf.engine import HFGenerateEngine
from ggpo_lightning.tasks.arithmetic import ArithmeticTask
from ggpo_lightning.tasks.tiny_model import TinyModelConfig, build_tiny_model
from ggpo_lightning.rollouts.vllm.engine import VLLMEngine


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden-size", type=int, default=512)
    parser.add_argument("--num-layers", type=int, default=8)
    parser.add_argument("--num-heads", type=int, default=8)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--k", type=int, default=8, help="Samples per prompt.")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=5, help="Timed rounds per engine.")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the HF engine.")
    return parser.parse_args()


def timed_round(engine: RolloutEngine, prompts: list[list[int]], k: int, sampling: SamplingConfig,
                seed: int) -> tuple[float, int, int]:
    """(seconds, response tokens, torch threads after the call) of one ``generate``."""
    torch.manual_seed(seed)
    start = time.perf_counter()
    generations = engine.generate(prompts, k, sampling)
    seconds = time.perf_counter() - start
    return seconds, sum(len(ids) for g in generations for ids in g.response_ids), torch.get_num_threads()


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    dtype = DTYPES[args.dtype]
    with tempfile.TemporaryDirectory(prefix="ggpo-vllm-bench-") as tmp:
        config = TinyModelConfig(hidden_size=args.hidden_size, num_layers=args.num_layers, num_heads=args.num_heads,
                                 sft_steps=0, task=ArithmeticTask(max_operand=99, ops="+"))
        folder = build_tiny_model(Path(tmp) / "model", config)
        tokenizer = load_tokenizer(folder)
        model = load_causal_lm(folder, dtype="float32").eval()
        parameters = sum(p.numel() for p in model.parameters())
        prompts = [tokenizer(f"{a}+{b}=")["input_ids"] for a, b in zip(range(10, 99, 11), range(3, 99, 7))]
        prompts = (prompts * args.prompts)[:args.prompts]
        sampling = SamplingConfig(temperature=1.0, max_new_tokens=args.max_new_tokens,
                                  generation_batch_size=args.prompts * args.k)
        engines: dict[str, RolloutEngine] = {
            "hf": HFGenerateEngine(model, tokenizer, dtype=dtype),
            "vllm": VLLMEngine(str(folder), tokenizer, dtype, engine_args={"max_model_len": 128}),
        }
        for engine in engines.values():
            engine.load_weights(model, version=0)
            timed_round(engine, prompts, args.k, sampling, seed=0)  # warm-up, untimed
        rounds: dict[str, list[tuple[float, int, int]]] = {name: [] for name in engines}
        for r in range(args.rounds):
            order = list(engines) if r % 2 == 0 else list(reversed(engines))
            for name in order:
                torch.set_num_threads(args.threads)  # vLLM lowers torch's threads while it serves
                rounds[name].append(timed_round(engines[name], prompts, args.k, sampling, seed=r + 1))

    print(f"generate: {parameters / 1e6:.1f}M-parameter Llama ({args.hidden_size} wide, {args.num_layers} layers), "
          f"{args.dtype}, {args.prompts} prompts x {args.k} samples, <= {args.max_new_tokens} new tokens, "
          f"temperature 1; median of {args.rounds} rounds after one warm-up; OMP_NUM_THREADS="
          f"{os.environ.get('OMP_NUM_THREADS', 'unset')}, {os.cpu_count()} CPUs, load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    medians = {}
    for name, results in rounds.items():
        seconds = statistics.median(s for s, _, _ in results)
        tokens = statistics.median(t for _, t, _ in results)
        medians[name] = seconds
        print(f"  {name:5s} {seconds:7.3f} s/round  {tokens / seconds:8.0f} response tokens/s  "
              f"({tokens:.0f} tokens, torch threads {sorted({th for _, _, th in results})})")
    print(f"  ratio hf / vllm seconds: {medians['hf'] / medians['vllm']:.2f} (> 1: vLLM faster)")


if __name__ == "__main__":
    main()
