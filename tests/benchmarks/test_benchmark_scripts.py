"""Every script under ``benchmarks/`` runs, at toy size, and prints what it promises: a refactor that breaks one
fails here, not in the next measurement session. (``step_memory.py``: tests/test_step_memory_benchmark.py;
``verifier_throughput.py``: tests/verifiers/test_benchmark_smoke.py.) These check that the scripts work and report
consistent figures; the figures themselves are measured on a quiet machine (docs/PERFORMANCE.md)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
sys.path.insert(0, str(BENCHMARKS))


def run_script(name: str, *args: str, cwd: Path | None = None, timeout: int = 600) -> str:
    result = subprocess.run([sys.executable, str(BENCHMARKS / name), *args], capture_output=True, text=True,
                            env=ENV, cwd=cwd, timeout=timeout)
    assert result.returncode == 0, (result.stdout[-2000:], result.stderr[-3000:])
    return result.stdout


def test_build_artifacts_makes_the_workload_offline_and_refuses_other_settings(tmp_path):
    """The benchmark's model folder and data come from the package's tiny-model code: the tiny shape (1.05M
    parameters, 40-token vocabulary), 4096 + 512 distinct sums with no held-out prompt in training; a second call
    reuses the folder, one with another warm-up length is refused instead of measuring another model."""
    from workload import N_TEST, N_TRAIN, build_artifacts

    from ggpo_lightning.records.errors import SettingsError

    folder = build_artifacts(tmp_path, "tiny", sft_steps=0)
    record = json.loads((folder / "model" / "tiny_model.json").read_text())
    assert record["n_parameters"] == 1_054_848 and record["config"]["hidden_size"] == 128
    assert json.loads((folder / "model" / "config.json").read_text())["vocab_size"] == 40
    train, test = ([json.loads(line)["prompt"] for line in (folder / "data" / f"{split}.jsonl").open()]
                   for split in ("train", "test"))
    assert (len(set(train)), len(set(test))) == (N_TRAIN, N_TEST) and not set(train) & set(test)
    assert re.fullmatch(r"\d+\+\d+=", train[0])
    stamp = (folder / "model" / "model.safetensors").stat().st_mtime_ns
    assert build_artifacts(tmp_path, "tiny", sft_steps=0) == folder
    assert (folder / "model" / "model.safetensors").stat().st_mtime_ns == stamp
    with pytest.raises(SettingsError, match="sft_steps: recorded 0, requested 1500"):
        build_artifacts(tmp_path, "tiny")


def test_vs_trl_runs_both_trainers_on_the_same_workload_and_reports_ratios(tmp_path):
    """``trl_worker.py`` (TRL's GRPOTrainer) and ``ggpo_worker.py`` on one model folder for 2 steps: both sample 8 x 8
    completions per step from the same 1.05M-parameter model, split their steps into the same phases, and the
    printed ratio is ours over TRL's."""
    from workload import PHASES

    out = tmp_path / "out"
    stdout = run_script("vs_trl.py", "--models", "tiny", "--precisions", "fp32", "--steps", "2", "--sft-steps", "0",
                        "--learning-steps", "0", "--util-response-len", "0",
                        "--artifacts", str(tmp_path / "artifacts"), "--out", str(out))
    (row,) = json.loads((out / "vs_trl.json").read_text())["rows"]
    assert row["systems"] == ["trl", "ggpo"] and row["n_params"] == 1_054_848
    for system in row["systems"]:
        steps = json.loads((out / f"tiny_fp32_{system}_r0.json").read_text())["per_step"]
        assert [s["completions"] for s in steps] == [64, 64], system
        assert all(s["completion_tokens"] >= 64 and s["prompt_tokens"] > 64 for s in steps), system
        assert len(row[system]["reward_per_step"]) == 2 and row[system]["peak_rss_mb"] > 0
        phases = row[system]["phase_s"]  # every phase measured, none negative (the step's rest included)
        assert set(phases) == set(PHASES) and all(seconds >= 0 for seconds in phases.values()), (system, phases)
        assert phases["generate"] > 0 and phases["reference_forward"] > 0 and phases["backward"] > 0, system
    ratio = row["ratio"]["ggpo"]
    assert ratio["completions_per_sec"] == pytest.approx(row["ggpo"]["completions_per_sec"]
                                                         / row["trl"]["completions_per_sec"])
    assert f"**ggpo/TRL** | {ratio['sec_per_step']:.2f}x" in stdout


@pytest.mark.slow
def test_vs_trl_async_learning_check_and_utilization(tmp_path):
    """The rest of ``vs_trl.py`` at toy size: asynchronous rollouts and ``model.compile`` beside sync, the learning
    check (TRL, ours with GGPO and with GRPO) with our accuracy curve, and the learner-utilization script, eager and
    compiled."""
    out = tmp_path / "out"
    run_script("vs_trl.py", "--models", "tiny", "--precisions", "fp32", "--steps", "3", "--async", "--compile",
               "--learning-steps", "4", "--learning-seeds", "42", "--learning-val-every", "2",
               "--util-response-len", "8", "--util-model", "tiny", "--sft-steps", "0",
               "--artifacts", str(tmp_path / "artifacts"), "--out", str(out))
    report = json.loads((out / "vs_trl.json").read_text())
    (row,) = report["rows"]
    assert row["systems"] == ["trl", "ggpo", "ggpo-async", "ggpo-compile"]
    for system in ("ggpo-async", "ggpo-compile"):
        assert all(seconds >= 0 for seconds in row[system]["phase_s"].values()), row[system]["phase_s"]
    learning = report["learning"]
    assert set(learning) == {"trl", "ggpo", "ggpo-grpo"}
    for system in ("ggpo", "ggpo-grpo"):
        (share,) = learning[system]["share_of_trl_time_to_trl_final_acc"]
        assert share is None or share > 0
    curve = json.loads((out / "learning_tiny_ggpo_seed42.json").read_text())["accuracy_curve"]
    assert [p["step"] for p in curve] == [2, 4] and curve[0]["train_seconds"] < curve[1]["train_seconds"]
    eager, compiled = report["utilization"]["runs"]
    assert not eager["compile"] and compiled["compile"] and compiled["compile_seconds"] > 0
    for update in (eager, compiled):
        assert update["response_tokens"] == 8 * 8 * 8 and update["model_flops_per_s"] > 0


@pytest.mark.slow
def test_learner_update_compiled_beside_eager_on_a_qwen3_shape(tmp_path):
    """``learner_update.py`` as the 0.5B measurement runs it (``--shape``, prompts, micro-batches, ``--compile``,
    ``--peak``) at toy size: eager then compiled, the same token counts, the compiles in the warm-up update only, and
    the share of the matmul peak."""
    from workload import build_artifacts

    folder = build_artifacts(tmp_path, "tiny", sft_steps=0)
    out = tmp_path / "update.json"
    run_script("learner_update.py", "--like", str(folder / "model"), "--shape", "qwen3-toy", "--prompts", "2",
               "--response-len", "40", "--max-tokens", "100", "--precisions", "fp32", "--repeat", "1", "--compile",
               "--peak", "--out", str(out))
    eager, compiled = json.loads(out.read_text())["runs"]
    assert (eager["compile"], compiled["compile"]) == (False, True) and eager["tokens"] == compiled["tokens"]
    assert eager["parameters"] == compiled["parameters"] == 106_880 and eager["max_tokens"] == 100
    assert 0 < compiled["compile_seconds"] < compiled["warm_up_seconds"] and compiled["compiles"] >= 3
    assert compiled["compiles_after_warm_up"] == 0
    assert all(0 < run["share_of_matmul_peak"] < 1 for run in (eager, compiled))


def test_learner_update_refuses_a_shape_that_would_not_fit_before_building_it(monkeypatch):
    """The 0.47B shape at 2 x 8 x 1024 tokens in micro-batches of 4096 needs ~31 GB by the memory estimate (the
    kernel killed it on a 24 GB host, 10 minutes in): one line naming --max-tokens, before any model is built; two
    rows per micro-batch (2100 tokens) fit in 23.5 GB."""
    import argparse

    import learner_update
    from transformers import Qwen3Config

    monkeypatch.setattr("ggpo_lightning.models.memory.available_host_memory", lambda: 23_500_000_000)
    config = Qwen3Config(**learner_update.SHAPES["qwen3-0.5b"])
    args = argparse.Namespace(response_len=1024, prompts=2, max_tokens=4096, precisions="bf16")
    with pytest.raises(SystemExit, match=r"needs about 3\d\.\d GB .* of 23.5 GB available here: lower --max-tokens"):
        learner_update.check_memory(config, args)
    learner_update.check_memory(config, argparse.Namespace(**{**vars(args), "max_tokens": 2100}))
    with pytest.raises(SystemExit, match="lower --max-tokens"):  # fp32 measured too: its activations are twice bf16's
        learner_update.check_memory(config, argparse.Namespace(**{**vars(args), "max_tokens": 2100,
                                                                  "precisions": "bf16,fp32"}))


def test_train_step_prints_both_phases():
    stdout = run_script("train_step.py", "--hidden-size", "32", "--num-layers", "1", "--num-heads", "2",
                        "--groups", "2", "--k", "2", "--response-len", "4", "--repeat", "1")
    rows = dict(re.findall(r"^(rollout|train step) +([\d.]+) ", stdout, flags=re.M))
    assert set(rows) == {"rollout", "train step"} and all(float(s) > 0 for s in rows.values())


def test_async_rollouts_compares_both_schedules(tmp_path):
    stdout = run_script("async_rollouts.py", "--out", str(tmp_path / "out"), "--objectives", "ggpo", "--steps", "4",
                        "--val-every", "2", "--", "--tiny_model.sft_steps=2", "--tiny_model.hidden_size=16",
                        "--tiny_model.num_layers=1", "--tiny_model.num_heads=1", "--synthetic_data.n_train=64",
                        "--synthetic_data.n_test=16", "--data.prompts_per_step=2", cwd=tmp_path)
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert set(results) == {"ggpo-sync-0", "ggpo-async-0"}
    for result in results.values():
        assert [p["step"] for p in result["curve"]] == [2, 4]
        assert result["summary"]["optimizer_steps"] == 4
    assert "over seeds:" in stdout


def test_staleness_lab_prints_the_grid_with_spread():
    stdout = run_script("staleness_lab.py", "--steps", "8", "--seeds", "2", "--table", "grid")
    assert re.search(r"^\| grpo \| [\d.]+ ± [\d.]+ \|", stdout, flags=re.M)
    refused = subprocess.run([sys.executable, str(BENCHMARKS / "staleness_lab.py"), "--seeds", "1"],
                             capture_output=True, text=True, env=ENV, timeout=120)
    assert refused.returncode == 2 and "--seeds must be at least 2" in refused.stderr


def test_checksum_speed_hashes_and_cleans_up(tmp_path):
    stdout = run_script("checksum_speed.py", "--gb", "0.002", "--repeats", "1", "--dir", str(tmp_path))
    assert re.search(r"^median \d+ MB/s", stdout, flags=re.M)
    assert list(tmp_path.iterdir()) == []  # the test file is removed


@pytest.mark.vllm
def test_vllm_generate_times_both_engines():
    pytest.importorskip("vllm")
    # head size 64: vLLM's CPU attention refuses 16
    stdout = run_script("vllm_generate.py", "--hidden-size", "128", "--num-layers", "1", "--num-heads", "2",
                        "--prompts", "2", "--k", "2", "--max-new-tokens", "4", "--rounds", "1", "--dtype", "float32")
    engines = dict(re.findall(r"^  (hf|vllm) +([\d.]+) s/round", stdout, flags=re.M))
    assert set(engines) == {"hf", "vllm"} and all(float(s) > 0 for s in engines.values())
    assert "ratio hf / vllm seconds:" in stdout


@pytest.mark.vllm
def test_vllm_servers_prints_the_generate_and_push_tables(tmp_path):
    """``vllm_servers.py`` at toy size: one fleet of two servers of the tiny workload model for both tables; the
    generate table has the colocated engine and 1 and 2 servers, the push table a row per server count and design
    (with its ratio to today's design at the same count) and the bare gloo broadcast it is compared with."""
    pytest.importorskip("vllm")
    stdout = run_script("vllm_servers.py", "--prompts", "2", "--k", "2", "--max-new-tokens", "4", "--rounds", "1",
                        "--push-models", "tiny", "--blocks", "1", "--push-rounds", "1", "--kv-cache-mib", "64",
                        "--work", str(tmp_path), "--json", str(tmp_path / "figures.json"), timeout=300)
    generate = dict(re.findall(r"^\| (colocated|1 server|2 servers) \| ([\d.]+) \|", stdout, flags=re.M))
    assert set(generate) == {"colocated", "1 server", "2 servers"} and all(float(x) > 0 for x in generate.values())
    pushes = re.findall(r"^\| tiny \| 0\.004 \| (\d) \| (today|bucketed|concurrent) \| ([\d.]+) .*\| ([\d.]+|-) \| "
                        r"[\d.]+ \| [\d.]+ \| [\d.]+ \|$", stdout, flags=re.M)
    assert {(count, design) for count, design, _, _ in pushes} == {
        (count, design) for count in "12" for design in ("today", "bucketed", "concurrent")}
    assert all(float(seconds) > 0 for _, _, seconds, _ in pushes)
    assert all(ratio == "1.00" for _, design, _, ratio in pushes if design == "today")
    assert re.search(r"^\| tiny \| 0\.004 \| 1 \| bare gloo broadcast \| [\d.]+ ", stdout, flags=re.M)
    figures = json.loads((tmp_path / "figures.json").read_text())
    assert figures["generate"]["engines"]["2 servers"]["responses"] == 2 * 2
    assert figures["push"]["tiny"]["bytes"] == 4 * 1_054_848 + 4 * 40 * 128  # fp32; the tied output layer again


@pytest.mark.vllm
def test_fleet_ranks_runs_both_schedules_on_two_processes_and_prints_the_ratio(tmp_path):
    """``fleet_ranks.py`` at toy size: two trainer processes on two local servers, 4 updates per schedule; a line per
    schedule with its updates per second and accuracies, then the async / sync ratio."""
    pytest.importorskip("vllm")
    stdout = run_script("fleet_ranks.py", "--steps", "4", "--val-size", "8", "--out", str(tmp_path), timeout=900)
    lines = dict(re.findall(r"^(sync|async) +4 updates in [\d.]+ s: ([\d.]+) updates/s;", stdout, flags=re.M))
    assert set(lines) == {"sync", "async"} and all(float(x) > 0 for x in lines.values()), stdout
    assert re.search(r"^async / sync updates per second: [\d.]+ ", stdout, flags=re.M)


def test_push_delta_prints_the_share_of_weights_that_change():
    stdout = run_script("push_delta.py", "--models", "tiny", "--lrs", "1e-4")
    (row,) = re.findall(r"^\| tiny \| 0\.0001 \| 1\.1M \| ([\d.]+)% \| ([\d.]+)% \| ([\d.]+)% \|", stdout, flags=re.M)
    shares = [float(x) for x in row]
    assert 0 < shares[0] <= 100 and all(0 < x <= 100 for x in shares)


def test_push_memory_measures_both_designs_on_two_ranks():
    stdout = run_script("push_memory.py", "--model", "tiny")
    rows = dict(re.findall(r"^\| (materialised|streamed) \| ([\d-]+) \| [\d-]+ \|$", stdout, flags=re.M))
    assert set(rows) == {"materialised", "streamed"}


def test_nccl_push_dry_run_on_cpu_over_gloo():
    stdout = run_script("nccl_push.py", "--backend", "gloo", "--device", "cpu", "--layers", "1", "--hidden", "64",
                        "--intermediate", "128", "--kv-dim", "32", "--vocab", "256", "--rounds", "1",
                        "--bucket-mib", "1")
    figures = json.loads(stdout.strip().splitlines()[-1])
    assert figures["bytes"] == 2 * (256 * 64 + 64 * 64 * 2 + 32 * 64 * 2 + 128 * 64 * 3 + 64 * 2 + 64)
    assert figures["push_median_s"] > 0 and figures["packing_median_s"] > 0


def test_rollout_logprobs_times_the_three_ways_and_checks_they_agree():
    stdout = run_script("rollout_logprobs.py", "--hidden-size", "32", "--num-layers", "1", "--num-heads", "2",
                        "--prompts", "2", "--k", "2", "--max-new-tokens", "4", "--rounds", "1")
    ways = dict(re.findall(r"^  (sample only|recorded|scored) +([\d.]+) s/round", stdout, flags=re.M))
    assert set(ways) == {"sample only", "recorded", "scored"}
    gap = float(re.search(r"max \|recorded - scored\| log-prob: ([\d.e+-]+)", stdout).group(1))
    assert gap < 1e-4  # fp32: the recorded behavior log-probs are the scoring forward's


def test_decode_loop_times_the_steps_and_splits_off_the_forward(tmp_path):
    """Per decoding step: the whole step, the forward's share and the rest (positive, adding up); ``--run-to-end``
    runs every row to the limit; ``--profile`` writes a chrome trace and the ops' table (CPU here)."""
    stdout = run_script("decode_loop.py", "--shape", "tiny", "--rows", "8", "--k", "2", "--max-new-tokens", "5",
                        "--rounds", "1", "--run-to-end", "--profile", str(tmp_path / "profile"))
    result = json.loads(stdout[stdout.index("{"):])
    assert (result["rows"], result["response_tokens"], result["parameters"]) == (8, 8 * 5, 1_054_848)
    assert 0 < result["forward_seconds_per_step"] < result["seconds_per_step"]
    assert result["outside_forward_seconds_per_step"] == pytest.approx(
        result["seconds_per_step"] - result["forward_seconds_per_step"])
    assert json.loads((tmp_path / "profile" / "trace.json").read_text())["traceEvents"]
    assert "aten::" in (tmp_path / "profile" / "key_averages.txt").read_text()


def _stack(*frames: str) -> list[str]:
    loop = ["<module> (ggpo_worker.py:131)", "_TrainingEpochLoop.advance (lightning/pytorch/loops/training_epoch_loop.py:352)"]
    return loop + list(frames)


def test_step_profile_classifies_samples_by_phase_and_leaf():
    from step_profile import classify

    step = ["Adam.step (torch/optim/adam.py:227)", "GGPOModule.training_step (ggpo_lightning/training/module.py:250)"]
    learner = step + ["batch_token_logprobs (ggpo_lightning/core/batch.py:98)", "LlamaMLP.forward (x.py:1)"]
    assert classify(_stack(*learner, "mkl_blas_avx512_sgemm_kernel_0_b0 (libtorch_cpu.so)")) == ("learner_forward",
                                                                                                 "matmul")
    reference = step + ["GGPOModule.step_loss (ggpo_lightning/training/module.py:290)",
                        "ReferenceLogprobCache.token_logprobs (ggpo_lightning/core/batch.py:155)",
                        "batch_token_logprobs (ggpo_lightning/core/batch.py:98)", "LlamaRMSNorm.forward (x.py:1)"]
    assert classify(_stack(*reference, "at::TensorIteratorBase::serial_for_each (libtorch_cpu.so)")) == (
        "reference_forward", "kernel")
    assert classify(_stack(*reference, "torch::PythonArgParser::raw_parse (libtorch_python.so)")) == (
        "reference_forward", "python")
    assert classify(_stack(*step)) == ("loss_and_metrics", "python")  # executing Python: no native frame below
    assert classify(_stack("Adam.step (torch/optim/adam.py:227)", "_fused_adamw_kernel_cpu_ (libtorch_cpu.so)",
                           "at::native::fused_adam_kernel (libtorch_cpu.so)")) == ("optimizer", "kernel")
    assert classify(_stack("_decode (ggpo_lightning/rollouts/hf/engine.py:260)")) == ("generate", "python")
    assert classify(["<module> (ggpo_worker.py:131)", "heldout_accuracy (ggpo_lightning/evaluation/accuracy.py:4)"]) is None


def test_step_profile_samples_a_worker_run(tmp_path):
    out = tmp_path / "profile.json"
    stdout = run_script("step_profile.py", "--model", "tiny", "--sft-steps", "0", "--artifacts", str(tmp_path),
                        "--steps", "6", "--rate", "200", "--out", str(out))
    summary = json.loads(out.read_text())
    shares = summary["shares"]
    assert summary["samples"] > 50 and sum(sum(row.values()) for row in shares.values()) == pytest.approx(1.0)
    for phase in ("generate", "learner_forward", "reference_forward", "backward"):  # each one sampled
        assert sum(shares.get(phase, {}).values()) > 0, (phase, shares)
    assert summary["totals"]["matmul"] > 0 and summary["totals"]["python"] > 0
    assert re.search(r"^all\s+\d", stdout, re.M)


def run_lease(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(BENCHMARKS / "gpu_lease.sh")], capture_output=True, text=True, timeout=600,
                          env={**ENV, "PY": sys.executable, "OUT": str(tmp_path / "out"), "WORK_ROOT": str(tmp_path),
                               **env})


def test_gpu_lease_skips_checks_the_deadline_leaves_no_time_for_and_refuses_unknown_ones(tmp_path):
    """The lease script's scheduling, without a GPU: a check whose time cap would fall under 30 s is skipped and
    said so; an unknown check name stops the script before anything runs."""
    result = run_lease(tmp_path, DEADLINE="20", CHECKS="smoke async")
    assert result.returncode == 0, result.stderr[-2000:]
    summary = (tmp_path / "out" / "summary.txt").read_text().splitlines()
    assert [line.split(":")[0] for line in summary] == ["== smoke", "== async"]
    assert all("skipped" in line for line in summary)
    assert (tmp_path / "out" / "env.txt").read_text()  # versions and machine, whatever else failed
    refused = run_lease(tmp_path, CHECKS="qwen4")
    assert refused.returncode == 2 and "unknown check qwen4" in refused.stderr


@pytest.mark.slow
def test_gpu_lease_runs_the_smoke_check_on_cpu_into_a_fresh_work_folder(tmp_path):
    """The smoke check end to end as a dry run on CPU (two processes, FSDP2, 2 steps): ``gpu_smoke.sh`` makes its
    ``WORK`` folder, the log is timestamped, the per-step figures are printed and the metrics come back."""
    result = run_lease(tmp_path, CHECKS="smoke", DEADLINE="400", ACCELERATOR="cpu", DEVICES="2",
                       PRECISION="32-true", SMOKE_STEPS="2", SMOKE_CAP="500")
    assert result.returncode == 0, result.stderr[-2000:]
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert "== smoke: exit 0" in summary and "median after step 0" in summary
    assert re.match(r"\d\d:\d\d:\d\d gpu_smoke: 2 x cpu", (tmp_path / "out" / "smoke.log").read_text())
    assert len((tmp_path / "out" / "smoke-metrics.csv").read_text().splitlines()) >= 3


def test_objective_cost_measures_each_objective_at_its_recipes_settings(tmp_path):
    """``objective_cost.py`` (issue 57's cost table) at toy size: one row per objective named, each at its recipe's
    settings (GGPO's anchor on as when stale, OAPL without it), with what it needs from the engine; a name without
    a recipe is refused before anything is measured."""
    out = tmp_path / "rows.json"
    stdout = run_script("objective_cost.py", "--objectives", "ggpo,oapl,grpo-tis", "--hidden", "64", "--layers", "1",
                        "--response-tokens", "8", "--prompts", "1", "--repeat", "1", "--out", str(out))
    rows = json.loads(out.read_text())
    assert [r["objective"] for r in rows] == ["ggpo", "oapl", "grpo-tis"]
    assert [r["anchor"] for r in rows] == [0.04, 0.0, 0.0]
    assert [r["behavior_logprobs"] for r in rows] == [False, True, True]
    assert all(r["seconds"] > 0 and r["update_mb"] >= 0 and r["passes"] == "whole" for r in rows)
    assert re.search(r"relative to ggpo: oapl x[\d.]+ s", stdout)
    refused = subprocess.run([sys.executable, str(BENCHMARKS / "objective_cost.py"), "--objectives", "ggpo,nope"],
                             capture_output=True, text=True, env=ENV, timeout=120)
    assert refused.returncode == 1 and "no recipe recipes/baselines/nope.yaml" in refused.stderr
    assert refused.stdout == ""
