"""Where a training step's time goes, down to what runs at the leaf: ``benchmarks/ggpo_worker.py`` sampled by py-spy
with native frames, each sample of the training loop classified by phase (from its Python frames) and by what the
CPU was doing (from its innermost native frames).

    .venv/bin/python benchmarks/step_profile.py --model tiny --steps 200 [--bf16] [--out F.json]

The model folder and data are ``benchmarks/vs_trl.py``'s (``workload.build_artifacts``, under
``--artifacts``, ``runs/bench`` by default): built here on first use, reused afterwards.

Phases (by the Python frames of a sample): ``generate`` (the HF engine's sampling and its
decoding loop), ``verify`` (the verifier), ``reference_forward`` (the frozen reference's log-probs),
``learner_forward`` (the learner's log-probs with gradient), ``backward``, ``loss_and_metrics`` (the rest of the
training step: packing, the objective, the step's metrics), ``optimizer`` (the rest of the optimizer's step: the
update, gradient norms and clipping, Lightning's closure), ``loop`` (the rest of Lightning's loop around the step:
fetching the batch, hooks, callbacks, the logger row).

What runs (the innermost native frames): ``matmul`` (MKL / oneDNN GEMM and the attention kernel), ``kernel``
(ATen's other CPU kernels: elementwise, reductions, softmax, copies, memory allocation), ``python`` (Python code
itself, pybind, the dispatcher, autograd's bookkeeping: the work of getting to a kernel). py-spy (``pip install py-spy``; the ``dev``
extra has it) needs permission to trace a child process (root, or ``ptrace_scope`` 0).
"""

from __future__ import annotations

import argparse
import collections
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from workload import MODELS, build_artifacts

PHASES = [  # (phase, substrings of a Python frame "function (path:line)"), in priority order: the first phase with a
    # matching frame anywhere in the stack wins (the whole training step runs inside the optimizer's closure, the
    # reference's forward inside the loss)
    ("verify", ("ggpo_verifiers/",)),
    ("generate", ("rollouts/hf/engine.py",)),
    ("reference_forward", ("ReferenceLogprobCache.",)),
    ("learner_forward", ("batch_token_logprobs (", "two_pass_loss (", "micro_batch_share (")),
    ("backward", ("torch/autograd/__init__.py", "torch/autograd/graph.py")),
    ("loss_and_metrics", ("training_step (ggpo_lightning/training/module.py",)),
    ("optimizer", ("torch/optim/",)),
]
STEP_MARK = "training_epoch_loop.py"  # samples outside the training loop (setup, evaluation) are left out
# innermost native frames: GEMM and attention kernels; ATen's other kernels and memory; else Python and dispatch
MATMUL = ("mkl_blas", "dnnl", "gemm", "gemv", "brgemm", "flash_attention", "amx")
KERNEL = ("at::native", "at::vec", "at::internal", "at::TensorIteratorBase", "c10::CPUAllocator", "memcpy", "memset",
          "memmove", "libgomp", "Sleef", "malloc (", "free (", "brk (", "mmap64 (", "munmap (", "madvise (")


def classify(frames: list[str]) -> tuple[str, str] | None:
    """``(phase, what)`` of one sample's frames (outermost first), None outside the training loop."""
    if not any(STEP_MARK in f for f in frames):
        return None
    phase = next((name for name, marks in PHASES if any(m in f for f in frames for m in marks)), "loop")
    native = []  # the innermost frames below the last Python frame
    for frame in reversed(frames):
        if ".py:" in frame:
            break
        native.append(frame)
    what = "python"
    for frame in native[:6]:
        if any(m in frame for m in MATMUL):
            what = "matmul"
            break
        if any(m in frame for m in KERNEL):
            what = "kernel"
            break
    return phase, what


def profile(args: argparse.Namespace, artifacts: Path, raw: Path) -> None:
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    worker = [sys.executable, str(HERE / "ggpo_worker.py"), "--artifacts", str(artifacts), "--steps",
              str(args.steps), "--threads", "1", "--eval-n", "8"] + (["--bf16"] if args.bf16 else [])
    command = [spy, "record", "--native", "--rate", str(args.rate), "--format", "raw", "--output", str(raw),
               "--subprocesses", "--"] + worker
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"py-spy failed (exit {result.returncode}): {result.stderr.strip()[-800:]}")


def summarize(raw: Path) -> dict:
    """``{phase: {what: share of the training loop's samples}}`` plus ``samples``."""
    counts: collections.Counter = collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        label = classify(stack.split(";")) if stack else None
        if label:
            counts[label] += int(count)
    total = sum(counts.values())
    if not total:
        sys.exit(f"no samples of the training loop in {raw}")
    table: dict = collections.defaultdict(dict)
    for (phase, what), n in sorted(counts.items()):
        table[phase][what] = n / total
    return {"samples": total, "shares": dict(table)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=sorted(MODELS), default="tiny")
    parser.add_argument("--artifacts", type=Path, default=HERE.parent / "runs" / "bench",
                        help="where the model folders and data are (built on first use)")
    parser.add_argument("--sft-steps", type=int, help="override the model's warm-up steps (0 for a smoke run)")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--rate", type=int, default=500, help="py-spy samples per second")
    parser.add_argument("--out", type=Path, help="write the summary JSON here")
    args = parser.parse_args()
    artifacts = build_artifacts(args.artifacts, args.model, args.sft_steps)
    with tempfile.TemporaryDirectory() as folder:
        raw = Path(folder) / "samples.txt"
        profile(args, artifacts, raw)
        summary = summarize(raw)
    whats = ("matmul", "kernel", "python")
    print(f"{'phase':18s} " + " ".join(f"{w:>7s}" for w in whats) + "   total   ({} samples)".format(summary["samples"]))
    for phase, row in sorted(summary["shares"].items(), key=lambda item: -sum(item[1].values())):
        print(f"{phase:18s} " + " ".join(f"{row.get(w, 0):7.1%}" for w in whats) + f" {sum(row.values()):7.1%}")
    totals = {w: sum(row.get(w, 0) for row in summary["shares"].values()) for w in whats}
    print(f"{'all':18s} " + " ".join(f"{totals[w]:7.1%}" for w in whats))
    if args.out:
        args.out.write_text(json.dumps({**summary, "totals": totals, "artifacts": str(artifacts),
                                        "bf16": args.bf16, "steps": args.steps}, indent=1))


if __name__ == "__main__":
    main()
