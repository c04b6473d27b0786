"""Generation on vLLM servers (``model.rollout.engine: vllm_server``, issue 41) against the colocated vLLM engine,
and the seconds of a weight push against the model's size. On CPU: the servers' weight transfer is the package's
``ggpo_gloo`` backend.

    HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 .venv-vllm/bin/python benchmarks/vllm_servers.py                 # both tables
    .venv-vllm/bin/python benchmarks/vllm_servers.py --measure generate --rounds 7
    .venv-vllm/bin/python benchmarks/vllm_servers.py --measure push --push-models tiny m30 qwen3-0.5b

Runs in the vLLM venv (``make setup-vllm``: the ``ggpo_gloo`` backend is this package's vLLM plugin). Never more than
two servers at once (``LocalFleet``, each ``--kv-cache-mib`` of KV cache, ``--max-model-len 128``; their logs under
``--work``).

**generate**: ``--prompts`` sums of the workload's held-out split (``benchmarks/workload.py``, model ``tiny``: the
quickstart's 1.05M-parameter Llama, random weights, so responses run to ``--max-new-tokens``) x ``--k`` samples at
temperature 1, log-probs recorded, through ``engine.generate`` of three engines on the same weights: ``colocated``
(:class:`~ggpo_lightning.rollouts.vllm.engine.VLLMEngine`, in this process), ``1 server`` and ``2 servers``
(:class:`~ggpo_lightning.rollouts.fleet.engine.VLLMServerEngine` over one and both servers of one fleet). One untimed
round each, then ``--rounds`` rounds, each timing the three in a rotating order. Prints per engine the median
completions/s (responses per second of ``generate`` wall time), its min-max over rounds, tokens/s, and the ratio to
the colocated engine per round (median and min-max: the figure to read on a shared machine), and the CPU seconds of
this process per round (the whole engine for ``colocated``; the HTTP client, JSON and decoding for the servers).

**push**: per model of ``--push-models`` (``tiny``, ``m30``: the workload's; ``qwen3-0.5b``: a Qwen3-shaped model
with random weights, Qwen3-0.6B's decoder with a 32768-token vocabulary), a fleet of two servers (fp32), then
``--blocks`` blocks; each block makes a fresh engine per server count (1, 2) and push design (``--designs``:
``today``, one tensor at a time, one server after the other; ``bucketed``, packed buckets with receive and load
overlapped, one server after the other; ``concurrent``, the buckets to every server at once), in a rotating order,
times its first ``load_weights`` (the gloo rendezvous included) and ``--push-rounds`` later ones, and closes it.
Prints per row the later pushes' seconds (median, min-max: what the learner is blocked for, ``load_weights`` runs
in its thread), GB/s per server (every tensor of the state dict, fp32, reaches each server), the ratio to a bare
gloo broadcast of the same bytes to one other process measured in the same run (buckets into two kept buffers: the
wire's speed here), the ratio to ``today`` at the same server count, and the seconds each server is paused.

The table of docs/PERFORMANCE.md ("Weight push: designs"), in one line:

    HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 .venv-vllm/bin/python benchmarks/vllm_servers.py --measure push --blocks 2
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from workload import MODELS, build_artifacts

from ggpo_lightning.models.loading import load_causal_lm, load_tokenizer
from ggpo_lightning.rollouts.config import SamplingConfig

QWEN3_05B = {"hidden_size": 1024, "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
             "head_dim": 128, "intermediate_size": 3072, "vocab_size": 32768, "tie_word_embeddings": True}
"""Qwen3-0.6B's decoder (28 layers, 1024 wide, 16 query / 8 key-value heads of 128, MLP 3072, tied embedding) with a
32768-token vocabulary: 0.47B parameters."""
PUSH_MODELS = (*MODELS, "qwen3-0.5b")
MAX_MODEL_LEN = 128


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--measure", choices=("generate", "push", "all"), default="all")
    parser.add_argument("--model", choices=sorted(MODELS), default="tiny", help="the generate table's model")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--k", type=int, default=8, help="responses per prompt")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5, help="timed generate rounds (after one warm-up)")
    parser.add_argument("--push-models", nargs="+", choices=PUSH_MODELS, default=list(PUSH_MODELS))
    parser.add_argument("--blocks", type=int, default=2, help="fresh engines per server count and model")
    parser.add_argument("--push-rounds", type=int, default=3, help="later pushes per engine")
    parser.add_argument("--designs", nargs="+", choices=list(DESIGNS), default=list(DESIGNS), help="push designs")
    parser.add_argument("--kv-cache-mib", type=int, default=256, help="KV cache of every vLLM instance")
    parser.add_argument("--work", type=Path, help="model folders and server logs (default: a temporary folder)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.blocks < 1 or args.push_rounds < 1:
        parser.error("--rounds, --blocks and --push-rounds must be at least 1")
    return args


# ---------------------------------------------------------------------------------------------------- models


def model_folder(root: Path, name: str) -> Path:
    """The folder of ``name``: the workload's model (random weights) or the Qwen3-shaped one, built once."""
    if name in MODELS:
        return build_artifacts(root, name, sft_steps=0) / "model"
    folder = root / name
    if not (folder / "config.json").exists():
        from transformers import Qwen3Config, Qwen3ForCausalLM

        from ggpo_lightning.tasks.tiny_model import build_tiny_tokenizer

        tokenizer = build_tiny_tokenizer()
        torch.manual_seed(0)
        config = Qwen3Config(**QWEN3_05B, max_position_embeddings=2048, bos_token_id=tokenizer.bos_token_id,
                             eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
        Qwen3ForCausalLM(config).save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    return folder


class Fleets:
    """One fleet of two local servers (fp32) at a time, of the model asked for last: the previous one is stopped
    first (never more than two servers), the current one at :meth:`close`."""

    def __init__(self, root: Path, kv_bytes: int) -> None:
        self.root, self.kv_bytes = root, kv_bytes
        self.name: str | None = None
        self.fleet = None

    def of(self, name: str, folder: Path):
        from ggpo_lightning.rollouts.fleet.launcher import LocalFleet

        if self.name == name:
            return self.fleet
        self.close()
        fleet = LocalFleet(str(folder), 2, log_dir=self.root / "logs" / name, dtype="float32",
                           extra_args=["--kv-cache-memory-bytes", str(self.kv_bytes),
                                       "--max-model-len", str(MAX_MODEL_LEN)])
        # the colocated engine sets VLLM_ENABLE_V1_MULTIPROCESSING=0 in this process: not the servers' business
        saved = os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
        start = time.perf_counter()
        try:
            fleet.start()
        finally:
            if saved is not None:
                os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = saved
        print(f"  2 servers of {name} up in {time.perf_counter() - start:.0f} s (logs: {fleet.log_dir})", flush=True)
        self.name, self.fleet = name, fleet
        return fleet

    def close(self) -> None:
        if self.fleet is not None:
            self.fleet.stop()
        self.name, self.fleet = None, None


def server_engine(urls: list[str], tokenizer, **push):
    from ggpo_lightning.rollouts.fleet.engine import VLLMServerEngine

    return VLLMServerEngine(urls, tokenizer, torch.float32, record_logprobs=True, request_timeout=900,
                            server_timeout=300, **push)


def colocated_engine(folder: Path, tokenizer, kv_bytes: int):
    from ggpo_lightning.rollouts.vllm.engine import VLLMEngine

    return VLLMEngine(str(folder), tokenizer, torch.float32, record_logprobs=True,
                      engine_args={"max_model_len": MAX_MODEL_LEN, "kv_cache_memory_bytes": kv_bytes})


def load_info() -> str:
    return (f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, {os.cpu_count()} CPUs, load average "
            f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def spread(values: list[float], digits: int = 2) -> str:
    return f"{min(values):.{digits}f}-{max(values):.{digits}f}"


# ---------------------------------------------------------------------------------------------------- generate


def measure_generate(args: argparse.Namespace, root: Path, fleets: Fleets) -> dict:
    folder = model_folder(root, args.model)
    tokenizer = load_tokenizer(folder)
    learner = load_causal_lm(folder, dtype="float32").eval()
    parameters = sum(p.numel() for p in learner.parameters())
    rows = [json.loads(line) for line in (folder.parent / "data" / "test.jsonl").open()]
    prompts = [tokenizer(row["prompt"])["input_ids"] for row in rows[:args.prompts]]
    sampling = SamplingConfig(temperature=1.0, top_p=1.0, max_new_tokens=args.max_new_tokens)
    kv_bytes = fleets.kv_bytes
    print(f"generate: {args.model} ({parameters / 1e6:.2f}M parameters, random weights), fp32, {len(prompts)} prompts "
          f"x {args.k}, <= {args.max_new_tokens} new tokens, temperature 1, log-probs recorded; {load_info()}",
          flush=True)
    fleet = fleets.of(args.model, folder)
    engines = {"colocated": colocated_engine(folder, tokenizer, kv_bytes),
               "1 server": server_engine(fleet.urls[:1], tokenizer),
               "2 servers": server_engine(fleet.urls, tokenizer)}
    for engine in engines.values():  # the servers' first push; the colocated engine loads the folder itself
        engine.load_weights(learner, version=0)
    results: dict[str, list[tuple[float, int, int, float]]] = defaultdict(list)

    def one_round(name: str, seed: int) -> tuple[float, int, int, float]:
        torch.manual_seed(seed)
        start, cpu = time.perf_counter(), time.process_time()
        generations = engines[name].generate(prompts, args.k, sampling)
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
        return (seconds, sum(len(g.response_ids) for g in generations),
                sum(len(ids) for g in generations for ids in g.response_ids), cpu)

    for name in engines:
        one_round(name, seed=0)  # warm-up, untimed
    names = list(engines)
    for r in range(args.rounds):
        order = names[r % 3:] + names[:r % 3]  # rotate who goes first
        for name in order:
            results[name].append(one_round(name, seed=r + 1))
    for engine in engines.values():
        engine.close()
    print(f"  end: {load_info()}")
    table = {}
    colocated = [c / s for s, c, _, _ in results["colocated"]]
    print("\n| engine | completions/s (median) | min-max | response tokens/s | s/round | x colocated (median, "
          "min-max per round) | CPU s/round of this process |\n|---|---|---|---|---|---|---|")
    for name, rounds in results.items():
        rates = [c / s for s, c, _, _ in rounds]
        ratios = [rate / base for rate, base in zip(rates, colocated)]
        tokens = statistics.median(t / s for s, _, t, _ in rounds)
        seconds = statistics.median(s for s, _, _, _ in rounds)
        cpu = statistics.median(u for _, _, _, u in rounds)
        table[name] = {"completions_per_s": statistics.median(rates), "min": min(rates), "max": max(rates),
                       "tokens_per_s": tokens, "s_per_round": seconds, "cpu_s_per_round": cpu,
                       "ratio_to_colocated": statistics.median(ratios), "ratio_min": min(ratios),
                       "ratio_max": max(ratios), "responses": rounds[0][1]}
        print(f"| {name} | {statistics.median(rates):.1f} | {spread(rates, 1)} | {tokens:.0f} | "
              f"{seconds:.2f} | {statistics.median(ratios):.2f} ({spread(ratios)}) | {cpu:.2f} |")
    lengths = [t / c for rounds in results.values() for _, c, t, _ in rounds]
    print(f"(mean response length {statistics.mean(lengths):.1f} tokens, {min(lengths):.1f}-{max(lengths):.1f} over "
          f"rounds: a random model stops at its EOS token)")
    return {"model": args.model, "parameters": parameters, "rounds": args.rounds, "engines": table}


# ---------------------------------------------------------------------------------------------------- push


DESIGNS = {"today": {"bucket_bytes": 0, "concurrent_push": False},
           "bucketed": {"bucket_bytes": None, "concurrent_push": False},
           "concurrent": {"bucket_bytes": None, "concurrent_push": True}}
"""The push designs compared: one tensor at a time to one server after the other (before issue 56); packed buckets,
receive and load overlapped, one server after the other; packed buckets to every server at once (the default)."""


class PauseTimer:
    """Seconds each server of an engine's push spends paused (``/pause`` sent to ``/resume`` answered)."""

    def __init__(self, engine) -> None:
        self.paused: list[float] = []
        self._since: dict[str, float] = {}
        post = engine._post

        def timed_post(server, route, *a, **kw):
            if route == "/pause":
                self._since[server.url] = time.perf_counter()
            try:
                return post(server, route, *a, **kw)
            finally:
                if route == "/resume":
                    self.paused.append(time.perf_counter() - self._since.pop(server.url))

        engine._post = timed_post

    def take(self) -> list[float]:
        paused, self.paused = self.paused, []
        return paused


def _bare_receiver(port: int, sizes: list[int], rounds: int) -> None:
    import datetime

    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", port, 2, is_master=False, timeout=datetime.timedelta(seconds=600))
    group = dist.ProcessGroupGloo(store, 1, 2, datetime.timedelta(seconds=600))
    buffers = [torch.empty(max(sizes), dtype=torch.uint8) for _ in range(2)]
    for _ in range(rounds):
        for i, size in enumerate(sizes):
            group.broadcast([buffers[i % 2][:size]]).wait()


def bare_broadcast(nbytes: int, bucket_bytes: int, rounds: int) -> list[float]:
    """Seconds of a bare gloo broadcast of ``nbytes`` to one other process, in buckets of ``bucket_bytes`` into two
    buffers it keeps (the wire's speed on this machine: no packing, no loading); the first of ``rounds`` (which
    touches the receiver's memory) left out."""
    import datetime

    import torch.distributed as dist
    import torch.multiprocessing as mp

    sizes = [bucket_bytes] * (nbytes // bucket_bytes) + ([nbytes % bucket_bytes] if nbytes % bucket_bytes else [])
    store = dist.TCPStore("127.0.0.1", 0, 2, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=600))
    receiver = mp.get_context("spawn").Process(target=_bare_receiver, args=(store.port, sizes, rounds + 1))
    receiver.start()
    group = dist.ProcessGroupGloo(store, 0, 2, datetime.timedelta(seconds=600))
    buffers = [torch.ones(max(sizes), dtype=torch.uint8) for _ in range(2)]
    seconds = []
    for _ in range(rounds + 1):
        start = time.perf_counter()
        works = [group.broadcast([buffers[i % 2][:size]]) for i, size in enumerate(sizes)]
        for work in works:
            work.wait()
        seconds.append(time.perf_counter() - start)
    receiver.join(60)
    return seconds[1:]


def measure_push(args: argparse.Namespace, root: Path, fleets: Fleets) -> dict:
    from ggpo_lightning.rollouts.fleet.gloo_backend import DEFAULT_BUCKET_BYTES

    figures = {}
    print(f"push: fp32, designs {', '.join(args.designs)}; {args.blocks} block(s), each a fresh engine per server "
          f"count and design (order rotating), timing its first push and {args.push_rounds} later ones; "
          f"{load_info()}", flush=True)
    models = sorted(args.push_models, key=lambda name: name != fleets.name)  # the running fleet's model first
    for name in models:
        folder = model_folder(root, name)
        tokenizer = load_tokenizer(folder)
        learner = load_causal_lm(folder, dtype="float32").eval()
        parameters = sum(p.numel() for p in learner.parameters())
        pushed = sum(t.numel() * t.element_size() for t in learner.state_dict().values())
        bare = bare_broadcast(pushed, DEFAULT_BUCKET_BYTES, max(3, args.push_rounds))
        later: dict[str, list[float]] = defaultdict(list)
        first: dict[str, list[float]] = defaultdict(list)
        paused: dict[str, list[float]] = defaultdict(list)
        fleet = fleets.of(name, folder)
        configs = [(design, count) for count in (1, 2) for design in args.designs]
        version = 0
        for block in range(args.blocks):
            for config in configs[block % len(configs):] + configs[:block % len(configs)]:
                design, count = config
                engine = server_engine(fleet.urls[:count], tokenizer, **DESIGNS[design])
                timer = PauseTimer(engine)
                key = f"{design}|{count}"
                for r in range(args.push_rounds + 1):
                    version += 1
                    start = time.perf_counter()
                    engine.load_weights(learner, version=version)
                    seconds = time.perf_counter() - start
                    if engine.alive != count:
                        raise RuntimeError(f"a push to {count} server(s) failed: see the logs under {root / 'logs'}")
                    (first if r == 0 else later)[key].append(seconds)
                    if r:
                        paused[key].extend(timer.take())
                    timer.take()
                engine.close()
        figures[name] = {"parameters": parameters, "bytes": pushed, "bare_s": bare, "first_s": dict(first),
                         "later_s": dict(later), "paused_s": dict(paused)}
        del learner
        print(f"  {name} done; {load_info()}", flush=True)
    print_push_table(figures)
    return figures


def print_push_table(figures: dict) -> None:
    print("\n| model | GB per server (fp32) | servers | design | later push s (median, min-max) | GB/s per server | "
          "x bare gloo | x today's | learner blocked s | paused s per server | first push s |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|")
    for name, f in figures.items():
        gb = f["bytes"] / 1e9
        bare_rate = gb / statistics.median(f["bare_s"])
        for key, seconds in f["later_s"].items():
            design, count = key.split("|")
            median = statistics.median(seconds)
            today = f["later_s"].get(f"today|{count}")
            ratio = f"{median / statistics.median(today):.2f}" if today else "-"
            paused = f["paused_s"].get(key) or [0.0]
            print(f"| {name} | {gb:.3f} | {count} | {design} | {median:.2f} ({spread(seconds)}) | {gb / median:.2f} | "
                  f"{gb / median / bare_rate:.2f} | {ratio} | {median:.2f} | {statistics.median(paused):.2f} | "
                  f"{statistics.median(f['first_s'][key]):.2f} |")
        print(f"| {name} | {gb:.3f} | 1 | bare gloo broadcast | {statistics.median(f['bare_s']):.2f} "
              f"({spread(f['bare_s'])}) | {bare_rate:.2f} | 1.00 | - | - | - | - |")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    with contextlib.ExitStack() as stack:
        root = args.work or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ggpo-vllm-servers-")))
        root.mkdir(parents=True, exist_ok=True)
        fleets = Fleets(root, args.kv_cache_mib << 20)
        stack.callback(fleets.close)
        result = {}
        if args.measure in ("generate", "all"):
            result["generate"] = measure_generate(args, root, fleets)
        if args.measure in ("push", "all"):
            result["push"] = measure_push(args, root, fleets)
        if args.json is not None:
            args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
