"""Two CPU processes (gloo) against one: FSDP2 through ModelParallelStrategy, and DDP.

Each run is a real ``ggpo-train`` subprocess on the tiny model; Lightning starts the
second rank itself. All runs train offline on the same buffer file with FIFO draws, so
a 2-process step sees exactly the groups of the 1-process step, split between ranks,
and their losses and updated weights must agree to float tolerance.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import random
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from ggpo_lightning.records.buffer import BehaviorBuffer
from ggpo_lightning.evaluation.accuracy import load_model
from ggpo_lightning.models.loading import load_tokenizer
from ggpo_lightning.testing import make_group

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "recipes"
STEPS, PROMPTS, SYNC_EVERY, REFRESH_EVERY = 4, 4, 3, 2
SINGLE = ["--config", str(RECIPES / "quickstart.yaml")]
FSDP = ["--config", str(RECIPES / "fsdp-cpu-2proc.yaml")]
DDP = [*FSDP, "--trainer.strategy", "ddp"]


@dataclass
class Workload:
    root: Path
    model: Path
    data: Path


@pytest.fixture(scope="module")
def workload(tmp_path_factory, tiny_model_dir, data_dir) -> Workload:
    """A buffer file of 16 groups (4 steps x 4 prompts) with mixed rewards, from the tiny tokenizer."""
    root = tmp_path_factory.mktemp("distributed")
    tokenizer = load_tokenizer(tiny_model_dir)
    rng = random.Random(0)
    digits = [tokenizer.convert_tokens_to_ids(str(d)) for d in range(10)]
    groups = []
    for i in range(STEPS * PROMPTS):
        responses = [[rng.choice(digits) for _ in range(rng.randint(1, 3))] + [tokenizer.eos_token_id]
                     for _ in range(8)]
        rewards = [float(j % 3 == i % 3) for j in range(8)]
        # recorded behavior log-probs (made up: the loss does not read them), so the drift and coverage are logged
        behavior = [[-0.5 - rng.random() for _ in response] for response in responses]
        groups.append(make_group(tokenizer(f"{i % 10}+{i // 10}=")["input_ids"], responses, rewards,
                                 prompt_id=f"g{i}", behavior_logprobs=behavior))
    buffer = BehaviorBuffer()
    buffer.add(groups)
    buffer.save_jsonl(root / "buffer.jsonl")
    return Workload(root, tiny_model_dir, data_dir)


def command(w: Workload, name: str, *args: str, overrides: tuple[str, ...] = ()) -> tuple[list[str], dict[str, str]]:
    """The arguments and environment of one ggpo-train run of this workload into ``w.root / name``.

    ``args`` come before this workload's settings, ``overrides`` after them (the last value wins)."""
    (w.root / name).mkdir(exist_ok=True)
    callbacks = w.root / name / "trace.yaml"
    callbacks.write_text(json.dumps({"trainer": {"callbacks": [
        {"class_path": "rank_trace.RankTrace", "init_args": {"out_dir": str(w.root / name / "trace")}}]}}))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), str(ROOT)])}
    env.pop("PL_GLOBAL_SEED", None)
    arguments = [
        *args, "--config", str(callbacks),
        "--model.model_name_or_path", str(w.model), "--tiny_model", "null",
        "--model.rollout.sync_every", str(SYNC_EVERY), "--model.ref_refresh_every", str(REFRESH_EVERY),
        "--model.eval.max_new_tokens", "3",
        "--data.train_path", str(w.data / "train.jsonl"), "--data.val_path", str(w.data / "test.jsonl"),
        "--synthetic_data", "null", "--data.val_size", "8",
        "--data.mode", "offline", "--data.buffer_path", str(w.root / "buffer.jsonl"), "--data.buffer_draw", "fifo",
        "--data.prompts_per_step", str(PROMPTS),
        "--trainer.max_steps", str(STEPS), "--trainer.val_check_interval", "2",
        "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
        "--trainer.logger.init_args.save_dir", str(w.root / name), "--trainer.logger.init_args.name", "run",
        "--checkpoint.every_n_train_steps", "1", "--checkpoint.save_top_k", "-1", *overrides,
    ]
    return arguments, env


def train(w: Workload, name: str, *args: str, overrides: tuple[str, ...] = ()) -> Path:
    """One ggpo-train run (and the ranks it starts) in a subprocess; returns its run directory."""
    arguments, env = command(w, name, *args, overrides=overrides)
    result = subprocess.run([sys.executable, "-m", "ggpo_lightning.cli.train", *arguments], env=env, cwd=w.root,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return w.root / name / "run" / "version_0"


def trace(run_dir: Path) -> dict[int, list[dict]]:
    """Each rank's per-step records (the last one is the state after training)."""
    files = sorted((run_dir.parents[1] / "trace").glob("rank*.jsonl"))
    return {int(f.stem[4:]): [json.loads(line) for line in f.read_text().splitlines()] for f in files}


def losses(run_dir: Path, name: str = "train/loss") -> list[float]:
    rows = csv.DictReader(open(run_dir / "metrics.csv"))
    return [float(r[name]) for r in rows if r.get(name)]


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(run_dir / "final_model" / "model.safetensors")


def assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], atol: float = 2e-6) -> None:
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=atol, msg=name)


@pytest.fixture(scope="module")
def single(workload) -> Path:
    return train(workload, "single", *SINGLE)


@pytest.fixture(scope="module")
def two_process_run(workload):
    """The two-process run of a strategy, trained once per module whichever test asks first."""
    runs: dict[str, Path] = {}

    def run(strategy: str) -> Path:
        if strategy not in runs:
            runs[strategy] = train(workload, strategy, *(FSDP if strategy == "fsdp" else DDP))
        return runs[strategy]

    return run


@pytest.mark.parametrize("strategy", ["fsdp", "ddp"])
def test_two_processes_train_as_one_on_the_same_groups(workload, single, two_process_run, strategy):
    run = two_process_run(strategy)
    one, two = trace(single), trace(run)
    assert sorted(two) == [0, 1]

    # disjoint groups per rank, together the single process's groups of that step
    for step in range(STEPS):
        ids0, ids1 = two[0][step]["prompt_ids"], two[1][step]["prompt_ids"]
        assert len(ids0) == len(ids1) == PROMPTS // 2 and not set(ids0) & set(ids1)
        assert sorted(ids0 + ids1) == sorted(one[0][step]["prompt_ids"])

    # the same loss (mean over ranks, as logged) and the same updated weights
    torch.testing.assert_close(torch.tensor(losses(run)), torch.tensor(losses(single)), rtol=1e-5, atol=1e-6)
    # coverage from both ranks' responses gathered: the max, percentile and ESS of the whole step, not a mean
    for name in ("coverage_log_ratio_max", "coverage_log_ratio_p95", "coverage_ess", "token_log_ratio_max"):
        assert len(losses(run, f"train/{name}")) == STEPS
        torch.testing.assert_close(torch.tensor(losses(run, f"train/{name}")),
                                   torch.tensor(losses(single, f"train/{name}")), rtol=1e-4, atol=1e-5)
    for step in range(STEPS):
        mean = (two[0][step]["local_loss"] + two[1][step]["local_loss"]) / 2
        assert mean == pytest.approx(one[0][step]["local_loss"], rel=1e-5, abs=1e-6)
    start = load_file(workload.model / "model.safetensors")
    final = weights(run)
    assert_same_weights(final, weights(single))
    assert max((final[k] - start[k]).abs().max().item() for k in start) > 1e-5  # it trained

    # rollout sync and reference refresh on the same steps on every rank, as on one process
    schedule = [(r["engine_version"], r["reference_is_learner"]) for r in one[0]]
    assert schedule == [(0, True), (0, False), (0, True), (3, False), (3, True)]  # sync 3, refresh 2
    for rank in (0, 1):
        assert [(r["engine_version"], r["reference_is_learner"]) for r in two[rank]] == schedule

    summary, reference = (json.loads((d / "summary.json").read_text()) for d in (run, single))
    assert summary["accuracy_before"] == reference["accuracy_before"]  # split over ranks, summed back
    assert summary["accuracy_after"] == reference["accuracy_after"]
    checkpoint = run / "checkpoints" / "epoch=0-step=2.ckpt"
    assert checkpoint.is_dir() if strategy == "fsdp" else checkpoint.is_file()
    # ggpo eval reads the last checkpoint (a sharded folder under FSDP2) as the exported model
    evaluated, _ = load_model(run / "checkpoints" / f"epoch=0-step={STEPS}.ckpt")
    assert_same_weights({k: v for k, v in evaluated.state_dict().items() if k in final}, final)


@pytest.mark.parametrize("budget", ["16", "4096"])
@pytest.mark.parametrize("strategy", ["fsdp", "ddp"])
def test_micro_batched_ranks_train_as_one_single_pass_process(workload, single, strategy, budget):
    """Two ranks with a budget of 16 tokens (one or two responses per micro-batch, groups split across them: two
    passes) or 4096 (whole groups: one pass) end where the single process without micro-batching did; unequal counts
    are padded (tests/core/test_microbatch.py)."""
    run = train(workload, f"{strategy}-micro-{budget}", *(FSDP if strategy == "fsdp" else DDP),
                overrides=("--model.micro_batch.max_tokens", budget))
    torch.testing.assert_close(torch.tensor(losses(run)), torch.tensor(losses(single)), rtol=1e-5, atol=1e-6)
    assert_same_weights(weights(run), weights(single), atol=1e-5)


def test_a_folder_that_is_not_a_sharded_checkpoint_is_named(tmp_path):
    (tmp_path / "x.ckpt").mkdir()
    with pytest.raises(ValueError, match=r"x.ckpt is a folder but not a sharded checkpoint"):
        load_model(tmp_path / "x.ckpt")


def test_lora_with_ddp_keeps_replicas_identical_through_refreshes(workload):
    """LoRA on 2 processes (DDP): a refresh draws a fresh adapter A on each rank; all take rank 0's.

    The draw comes from each process's RNG stream (Lightning re-seeds distributed ranks),
    so the adapter after a refresh differs from a single process's: the losses still
    match (right after a refresh B = 0, whatever A is), the weights need not.
    """
    lora = ["--config", str(RECIPES / "quickstart-lora.yaml")]
    one = train(workload, "lora-single", *lora)
    two = train(workload, "lora-ddp", *lora, "--trainer.devices", "2", "--trainer.strategy", "ddp")
    torch.testing.assert_close(torch.tensor(losses(two)), torch.tensor(losses(one)), rtol=1e-4, atol=1e-6)
    ranks = trace(two)
    checksums = [[r["trainable_checksum"] for r in ranks[rank]] for rank in (0, 1)]
    assert checksums[0] == checksums[1] and len(set(checksums[0])) == STEPS + 1  # identical replicas, all moving
    assert json.loads((two / "summary.json").read_text())["final_adapter"]


@pytest.mark.parametrize("strategy,resume_on,step", [("fsdp", 2, 3), ("fsdp", 1, 2), ("ddp", 2, 3)])
def test_a_checkpoint_from_two_processes_resumes(workload, two_process_run, strategy, resume_on, step):
    """Resumed at ``step``, the run ends where the uninterrupted one did (FSDP: also on 1 process).

    At step 3 the engine was synced at that step (sync every 3): the checkpoint leaves its
    weights out and the resumed ranks rebuild them from the learner; at step 2 it holds them.
    """
    uninterrupted = two_process_run(strategy)
    args = FSDP if strategy == "fsdp" else DDP
    if resume_on == 1:
        args = [*args, "--trainer.devices", "1", "--trainer.strategy.data_parallel_size", "1"]
    checkpoint = uninterrupted / "checkpoints" / f"epoch=0-step={step}.ckpt"
    run = train(workload, f"{strategy}-resumed-on-{resume_on}", *args, "--ckpt_path", str(checkpoint))
    assert_same_weights(weights(run), weights(uninterrupted))
    assert losses(run) == pytest.approx(losses(uninterrupted)[step:], rel=1e-5, abs=1e-6)
    resumed = trace(run)
    assert sorted(resumed) == list(range(resume_on))
    assert resumed[0][0]["step"] == step and resumed[0][-1]["step"] == STEPS
    before = trace(uninterrupted)[0][step]
    for rank in resumed:  # the rollout engine as it was, saved or rebuilt from the learner
        assert resumed[rank][0]["engine_version"] == before["engine_version"] == step - step % SYNC_EVERY
        assert resumed[rank][0]["engine_checksum"] == pytest.approx(before["engine_checksum"], rel=1e-6)


@pytest.mark.parametrize("strategy", ["fsdp", "ddp"])
def test_online_ranks_roll_out_disjoint_prompts_with_the_engine_synced_every_update(workload, strategy):
    """Online, sync every update: one process would sample with the learner itself; under FSDP2 the
    engine gets its own full copy, under DDP each rank samples with its replica."""
    run = train(workload, f"{strategy}-online", *(FSDP if strategy == "fsdp" else DDP), overrides=(
        "--data.mode", "online", "--data.buffer_path", "null", "--data.buffer_draw", "null",
        "--model.rollout.sync_every", "1", "--trainer.max_steps", "2"))
    ranks = trace(run)
    for step in range(2):
        ids = [ranks[rank][step]["prompt_ids"] for rank in (0, 1)]
        assert len(ids[0]) == len(ids[1]) == PROMPTS // 2 and not set(ids[0]) & set(ids[1])
        assert ranks[0][step]["engine_version"] == ranks[1][step]["engine_version"] == step
    summary = json.loads((run / "summary.json").read_text())
    assert summary["generated_samples"] == 2 * PROMPTS * 8  # both ranks' samples, counted once each


def test_a_rollout_that_fails_on_one_rank_stops_every_rank_with_one_line(workload):
    """Rank 1's rollout of step 3 raises a deliberate stop (as when it finds no server): rank 0 stops at the same
    point instead of waiting in the step's all-reduce; each rank saves its part of aborted.ckpt and prints the same
    one line; exit 1 (the run bounded by the subprocess's timeout)."""
    message = "no vLLM server usable for model.rollout.server_timeout=5 s (http://a: refused)"
    fail = json.dumps({"class_path": "rank_faults.FailingRollout", "init_args": {"rank": 1, "call": 3,
                                                                                 "message": message}})
    arguments, env = command(workload, "rank-fails", *FSDP, overrides=(
        "--data.mode", "online", "--data.buffer_path", "null", "--data.buffer_draw", "null",
        "--model.rollout.sync_every", "1", "--trainer.max_steps", "4", "--trainer.callbacks+", fail))
    result = subprocess.run([sys.executable, "-m", "ggpo_lightning.cli.train", *arguments], env=env,
                            cwd=workload.root, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stderr[-5000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("ggpo-train: aborted: ")]
    assert lines == [f"ggpo-train: aborted: {message}"] * 2, result.stderr[-5000:]
    run = workload.root / "rank-fails" / "run" / "version_0"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "aborted" and summary["optimizer_steps"] == 2 and summary["reason"] == message
    assert (run / "checkpoints" / "aborted.ckpt").is_dir()  # FSDP2: one shard per rank and meta.pt


def test_an_offline_fill_on_two_processes_saves_one_file_in_prompt_order(workload):
    """Each rank rolls out its share of the prompts; rank 0 writes them all, in one process's order."""
    fill = ("--data.mode", "offline", "--data.buffer_path", "null", "--data.offline_prompts", "8",
            "--trainer.max_steps", "1")
    runs = [train(workload, "fill-single", *SINGLE, overrides=fill),
            train(workload, "fill-fsdp", *FSDP, overrides=fill)]
    saved = [BehaviorBuffer.load_jsonl(run / "behavior_buffer.jsonl").groups() for run in runs]
    assert [g.prompt_id for g in saved[1]] == [g.prompt_id for g in saved[0]]
    assert len({g.prompt_id for g in saved[1]}) == 8


@pytest.mark.vllm
def test_fsdp_ranks_each_sync_their_vllm_engine_from_the_gathered_learner(workload, wide_tiny_model_dir):
    """Two FSDP2 ranks, each with its own vLLM engine (float32), synced every 2 updates from the gathered
    learner: right after a sync the engines' recorded log-probs are the learner's (drift KL ~ 0; the logged
    metric is the mean over both ranks), one update later they are not (so the check can fail)."""
    w = Workload(workload.root, wide_tiny_model_dir, workload.data)  # vLLM's CPU attention needs head size 32
    run = train(w, "fsdp-vllm", *FSDP, overrides=(
        "--data.mode", "online", "--data.buffer_path", "null", "--data.buffer_draw", "null",
        "--model.rollout.engine", "vllm", "--model.rollout.sync_every", "2", "--model.rollout.vllm_args",
        '{"max_model_len": 64}', "--model.optimizer.init_args.lr", "0.01"))
    ranks = trace(run)
    for rank in (0, 1):
        assert [r["engine_version"] for r in ranks[rank][:STEPS]] == [0, 0, 2, 2]
    rows = [r for r in csv.DictReader(open(run / "metrics.csv")) if r.get("train/kl_behavior_k3")]
    staleness = [float(r["train/staleness"]) for r in rows]
    kl = [float(r["train/kl_behavior_k3"]) for r in rows]  # [steps], >= 0
    print(f"FSDP2 x 2 ranks, vLLM engines: KL(mu || pi) (k3) per step {kl}, staleness {staleness}")
    assert staleness == [0, 1, 0, 1]
    assert max(kl[0], kl[2]) < 1e-7  # the synced engines sample from the learner (fp32 kernels apart)
    assert min(kl[1], kl[3]) > 100 * max(kl[0], kl[2], 1e-9)  # one update of staleness shows


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def two_nodes(arguments: list[str], env: dict[str, str], cwd: Path, logs: list[Path]) -> list[int]:
    """``ggpo-train arguments`` as two "nodes" of one process each on localhost (torchrun, ``--nnodes 2``, the
    rendezvous on loopback), each node's output into its log; the exit codes. A node that fails leaves the
    other waiting in a collective: both are stopped at the first failure (or after 300 s)."""
    port = str(free_port())
    with contextlib.ExitStack() as files:
        nodes = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
                                   "--nproc_per_node", "1", "--node_rank", str(node), "--master_addr", "127.0.0.1",
                                   "--master_port", port, "-m", "ggpo_lightning.cli.train", *arguments],
                                  env=env, cwd=cwd, stdout=files.enter_context(open(log, "w")),
                                  stderr=subprocess.STDOUT)
                 for node, log in zip((0, 1), logs)]
        deadline = time.monotonic() + 300
        try:
            while time.monotonic() < deadline and any(node.poll() is None for node in nodes):
                if any(node.returncode not in (None, 0) for node in nodes):
                    break
                try:  # a bounded wait on a running node, not a sleep
                    next(node for node in nodes if node.returncode is None).wait(timeout=1)
                except subprocess.TimeoutExpired:
                    pass
        finally:
            for node in nodes:
                node.kill()  # no-op for a finished one; no stray rank left behind
                node.wait()
    return [node.returncode for node in nodes]


@pytest.mark.slow
def test_two_nodes_through_torchrun_train_as_one_node_with_two_processes(workload, two_process_run):
    """Two "nodes" of one process each (:func:`two_nodes`): the FSDP2 recipe trains to the same losses and weights
    as one node with two processes; only node 0 locks the run directory (node 1's launcher sets ``GROUP_RANK=1``,
    not ``NODE_RANK``), so no second lock or version folder. Then a resume from one of its sharded checkpoints
    with a flipped bit in one shard: each rank hashes its share, the verdict is gathered, and both nodes stop
    with the same error (neither waits in a collective)."""
    nodes = ("--trainer.devices", "1", "--trainer.num_nodes", "2")
    arguments, env = command(workload, "two-nodes", *FSDP, overrides=nodes)
    logs = [workload.root / "two-nodes" / f"node{node}.log" for node in (0, 1)]
    codes = two_nodes(arguments, env, workload.root, logs)
    assert codes == [0, 0], "\n".join(log.read_text()[-4000:] for log in logs)
    run = workload.root / "two-nodes" / "run" / "version_0"
    assert sorted(p.name for p in run.parent.iterdir()) == [".version_0.lock", "version_0"]  # one lock, one folder
    assert sorted(trace(run)) == [0, 1]
    one_node = two_process_run("fsdp")
    torch.testing.assert_close(torch.tensor(losses(run)), torch.tensor(losses(one_node)), rtol=1e-5, atol=1e-6)
    assert_same_weights(weights(run), weights(one_node))

    damaged = run / "checkpoints" / "epoch=0-step=2.ckpt"
    shard = sorted(damaged.glob("*.distcp"))[-1]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 1
    shard.write_bytes(bytes(data))
    arguments, env = command(workload, "two-nodes-resumed", *FSDP, overrides=(*nodes, "--ckpt_path", str(damaged)))
    logs = [workload.root / "two-nodes-resumed" / f"node{node}.log" for node in (0, 1)]
    codes = two_nodes(arguments, env, workload.root, logs)
    outputs = [log.read_text() for log in logs]
    assert all(code not in (0, None) for code in codes), codes
    for out in outputs:  # every rank names the damaged shard, whichever rank hashed it
        assert f"checkpoint {damaged} is damaged: {shard} does not match its checksum" in out, out[-4000:]
