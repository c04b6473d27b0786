"""Seconds per decoding step of the HF engine's loop (``sample_responses``), and how much of it is not the forward.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/decode_loop.py                   # m30 shape, 256 rows, 64 tokens
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/decode_loop.py --like DIR --run-to-end
    .venv/bin/python benchmarks/decode_loop.py --device cuda --profile OUT/profile  # + one rollout profiled

A randomly initialised model (nothing downloaded): a Llama of a ``benchmarks/workload.py`` shape (``--shape``, default
``m30``, 33.6M parameters, the 40-token word-level vocabulary) or of the shape in ``--like``'s ``config.json`` (its
tokenizer too). ``--rows`` rows (``--rows / --k`` prompts of 8-16 random non-special tokens, ``--k`` responses each),
temperature 1, up to ``--max-new-tokens``; ``--run-to-end`` makes no token the EOS, so every row runs to the limit.
One torch thread by default (``--threads``). ``--rounds`` timed rollouts after one warm-up, medians.

Prints one JSON object: ``seconds_per_step`` (a rollout's wall time over its decoding steps, the longest response's
length: the prompts' forward amortised in), ``forward_seconds_per_step`` (the time inside the model's children, its
decoder and output head, timed by forward hooks) and ``outside_forward_seconds_per_step``, the difference: Python,
dispatch and cache management. On a GPU the forward's kernels run asynchronously, so there the split says how long the
host spent issuing the forward, not how long the GPU ran it (the rollout's wall time is synchronised).

``--profile DIR`` runs one more rollout under ``torch.profiler`` (CPU, and CUDA where the model is on a GPU) and writes
``DIR/trace.json`` (a chrome trace: chrome://tracing or ui.perfetto.dev) and ``DIR/key_averages.txt`` (the ops by
total time).

Uses only ``sample_responses`` arguments that every version has had, and reads its result as ``result[0]``, so that
the same script measures an older checkout (``PYTHONPATH=that checkout``) for a before/after comparison.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))
from workload import MODELS, time_forwards  # the benchmarks' shared workload, beside this script

PROMPT_TOKENS = (8, 16)
"""The prompts' length range in tokens (inclusive)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=sorted(MODELS), default="m30", help="a benchmarks/workload.py shape")
    parser.add_argument("--like", type=Path, help="a model folder whose config (and tokenizer) to use instead")
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--run-to-end", action="store_true", help="no EOS: every row runs to --max-new-tokens")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--profile", type=Path, help="write a torch.profiler trace of one more rollout here")
    args = parser.parse_args()

    import torch

    from ggpo_lightning.rollouts.hf.engine import sample_responses

    torch.set_num_threads(args.threads)
    model, tokenizer = _random_model(args)
    model.to(device=args.device, dtype=getattr(torch, args.dtype)).eval()
    # sample_responses reads only these two ids; an EOS no token has never stops a row
    ids = SimpleNamespace(pad_token_id=tokenizer.pad_token_id,
                          eos_token_id=-1 if args.run_to_end else tokenizer.eos_token_id)
    generator = torch.Generator().manual_seed(0)
    ordinary = [i for i in range(model.config.vocab_size) if i not in set(tokenizer.all_special_ids)]
    prompts = [[ordinary[int(j)] for j in torch.randint(len(ordinary), (int(length),), generator=generator)]
               for length in torch.randint(PROMPT_TOKENS[0], PROMPT_TOKENS[1] + 1, (args.rows // args.k,),
                                           generator=generator)]
    phase = {"forward": 0.0}
    time_forwards(model, phase, "forward")

    def rollout() -> list[list[int]]:
        torch.manual_seed(0)
        responses = sample_responses(model, ids, prompts, args.max_new_tokens, args.k, do_sample=True,
                                     temperature=1.0, top_p=1.0, top_k=0)[0]
        if args.device != "cpu":
            torch.cuda.synchronize()
        return responses

    rollout()  # warm-up
    per_step, forward_per_step, tokens = [], [], 0
    for _ in range(args.rounds):
        phase["forward"] = 0.0
        start = time.perf_counter()
        responses = rollout()
        wall = time.perf_counter() - start
        steps = max(len(r) for r in responses)
        per_step.append(wall / steps)
        forward_per_step.append(phase["forward"] / steps)
        tokens = sum(len(r) for r in responses)
    step, forward = statistics.median(per_step), statistics.median(forward_per_step)
    result = {"rows": len(prompts) * args.k, "k": args.k, "max_new_tokens": args.max_new_tokens,
              "run_to_end": args.run_to_end, "response_tokens": tokens, "shape": str(args.like or args.shape),
              "parameters": sum(p.numel() for p in model.parameters()), "device": args.device, "dtype": args.dtype,
              "threads": args.threads, "rounds": args.rounds, "seconds_per_step": step,
              "forward_seconds_per_step": forward, "outside_forward_seconds_per_step": step - forward}
    if args.profile:
        result["profile"] = _profile(rollout, args.profile, args.device != "cpu")
    print(json.dumps(result, indent=1))


def _random_model(args: argparse.Namespace):
    """``(model, tokenizer)``: random weights of ``--like``'s config or of the ``--shape``."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from ggpo_lightning.models.loading import load_tokenizer
    from ggpo_lightning.tasks.tiny_model import TinyModelConfig, build_tiny_model

    if args.like is None:
        fields = {key: value for key, value in MODELS[args.shape].items() if not key.startswith("sft_")}
        with tempfile.TemporaryDirectory() as tmp:
            folder = build_tiny_model(Path(tmp) / "model", TinyModelConfig(
                **fields, sft_steps=0, max_position_embeddings=max(128, PROMPT_TOKENS[1] + args.max_new_tokens)))
            return AutoModelForCausalLM.from_pretrained(folder), load_tokenizer(folder)
    return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(args.like)), load_tokenizer(args.like)


def _profile(rollout, folder: Path, cuda: bool) -> dict[str, str]:
    """One rollout under ``torch.profiler``: a chrome trace and the ops' table by total time, in ``folder``."""
    from torch.profiler import ProfilerActivity, profile

    folder.mkdir(parents=True, exist_ok=True)
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    with profile(activities=activities) as prof:
        rollout()
    prof.export_chrome_trace(str(folder / "trace.json"))
    sort = "cuda_time_total" if cuda else "cpu_time_total"
    (folder / "key_averages.txt").write_text(prof.key_averages().table(sort_by=sort, row_limit=60))
    return {"trace": str(folder / "trace.json"), "key_averages": str(folder / "key_averages.txt")}


if __name__ == "__main__":
    main()
