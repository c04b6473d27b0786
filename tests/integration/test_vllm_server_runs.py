"""ggpo-train with generation on vLLM servers (``model.rollout.engine: vllm_server``), against real servers.

The quickstart's own model and data, built once for the module by the recipe's code; two servers of that model
(``LocalFleet``) shared by the runs that name them by URL. The quickstart learns on them with the sync and the
async schedule by the thresholds of the colocated engine's tests; a server killed mid-run costs throughput, and is
re-synced and used again once restarted; with both gone the run aborts with ``aborted.ckpt`` and resumes from it
once they are back; two FSDP2 processes share the fleet; ``servers: local:N`` starts and stops servers of its own.
``make test-vllm`` runs these (about 10 minutes on two cores).
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import server_faults
from ggpo_lightning.cli.train import exit_code, run_training
from ggpo_lightning.records.errors import RunAborted

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "recipes" / "quickstart.yaml"
ASYNC = ROOT / "recipes" / "overlays" / "async.yaml"
FSDP = ROOT / "recipes" / "fsdp-cpu-2proc.yaml"
SERVER_ARGS = ["--kv-cache-memory-bytes", str(64 << 20)]


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory) -> Path:
    """A folder whose runs/quickstart holds the quickstart's tiny model and data (built by one short run)."""
    root = tmp_path_factory.mktemp("quickstart")
    subprocess.run([sys.executable, "-m", "ggpo_lightning.cli.train", "--config", str(QUICKSTART),
                    "--trainer.max_steps", "1", "--data.val_size", "8", "--summary.export", "false"],
                   cwd=root, check=True, capture_output=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    return root


@pytest.fixture(scope="module")
def fleet(quickstart):
    from ggpo_lightning.rollouts.fleet.launcher import LocalFleet

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    fleet = LocalFleet(str(quickstart / "runs" / "quickstart" / "tiny-model"), 2, log_dir=quickstart / "servers",
                       dtype="float32", extra_args=SERVER_ARGS)
    fleet.start()
    server_faults.FLEET = fleet
    yield fleet
    fleet.stop()


def servers(fleet) -> list[str]:
    return ["--model.rollout.engine", "vllm_server", "--model.rollout.servers", json.dumps(fleet.urls)]


def train(root: Path, monkeypatch, *args: str):
    monkeypatch.chdir(root)  # the recipe's model and data are under runs/quickstart
    return run_training(["--config", str(QUICKSTART), *args])


def rows(cli) -> list[dict[str, str]]:
    return list(csv.DictReader(open(Path(cli.trainer.log_dir) / "metrics.csv")))


def summary(cli) -> dict:
    return json.loads((Path(cli.trainer.log_dir) / "summary.json").read_text())


def trained(metrics: list[dict[str, str]], key: str) -> list[float]:
    return [float(r[key]) for r in metrics if r.get(key)]


@pytest.mark.parametrize("schedule", ["sync", "async"])
def test_the_quickstart_learns_on_two_servers(quickstart, fleet, monkeypatch, schedule):
    """100 updates, held-out greedy accuracy (256 prompts) up by more than 0.05 (the colocated engine's threshold),
    both servers in use at every step."""
    overlay = ["--config", str(ASYNC)] if schedule == "async" else []
    cli = train(quickstart, monkeypatch, *overlay, *servers(fleet), "--trainer.max_steps", "100",
                "--trainer.val_check_interval", "100", "--data.val_size", "256")
    result, metrics = summary(cli), rows(cli)
    print(f"quickstart on two vLLM servers ({schedule}), 100 updates: accuracy {result['accuracy_before']:.3f} -> "
          f"{result['accuracy_after']:.3f} in {result['wall_seconds']:.0f} s")
    assert result["accuracy_after"] > result["accuracy_before"] + 0.05, result
    assert trained(metrics, "train/servers_alive") == [2.0] * 100
    assert cli.model.engine.version >= 99  # pushed after every update (async: the last push may follow the last step)
    if schedule == "async":
        assert max(trained(metrics, "train/staleness_max")) <= 1


def test_a_killed_server_costs_throughput_and_is_re_synced_when_back(quickstart, fleet, monkeypatch, caplog):
    """kill -9 of server 0 after update 3: the run goes on with server 1 and names server 0 once; restarted after
    update 6 (its weights the folder's again), it receives the next push and serves again."""
    callback = json.dumps({"class_path": "server_faults.KillServers",
                           "init_args": {"indices": [0], "kill_step": 3, "restart_step": 6}})
    with caplog.at_level("WARNING"):
        cli = train(quickstart, monkeypatch, *servers(fleet), "--trainer.max_steps", "12", "--data.val_size", "16",
                    "--trainer.val_check_interval", "12", "--trainer.callbacks+", callback)
    assert summary(cli)["status"] == "completed"
    alive = trained(rows(cli), "train/servers_alive")
    assert alive[:3] == [2.0] * 3 and alive[4] == 1.0 and alive[-1] == 2.0, alive
    assert sum(trained(rows(cli), "train/server_resyncs")) == 1
    dead = fleet.urls[0]
    assert sum(dead in r.getMessage() and "taken out" in r.getMessage() for r in caplog.records) == 1


def test_with_every_server_gone_the_run_aborts_then_resumes(quickstart, fleet, monkeypatch):
    callback = json.dumps({"class_path": "server_faults.KillServers",
                           "init_args": {"indices": [0, 1], "kill_step": 2}})
    with pytest.raises(RunAborted) as stop:
        train(quickstart, monkeypatch, *servers(fleet), "--trainer.max_steps", "6", "--data.val_size", "16",
              "--trainer.val_check_interval", "6", "--model.rollout.server_timeout", "5",
              "--trainer.callbacks+", callback, "--trainer.logger.init_args.name", "gone")
    message = str(stop.value)
    assert "\n" not in message and exit_code(stop.value) != 0
    assert all(url in message for url in fleet.urls) and "model.rollout.server_timeout=5 s" in message
    aborted = quickstart / "runs" / "gone" / "version_0" / "checkpoints" / "aborted.ckpt"
    assert aborted.exists()
    fleet.restart(0)
    fleet.restart(1)
    cli = train(quickstart, monkeypatch, *servers(fleet), "--trainer.max_steps", "6", "--data.val_size", "16",
                "--trainer.val_check_interval", "6", "--ckpt_path", str(aborted),
                "--trainer.logger.init_args.name", "gone")
    assert summary(cli)["status"] == "completed" and cli.trainer.global_step == 6
    assert trained(rows(cli), "train/servers_alive")[-1] == 2.0


def test_two_fsdp_processes_share_the_servers(quickstart, fleet):
    """Two trainer processes (FSDP2 on gloo), each sending its own prompts to the same two servers; rank 0 pushes the
    gathered weights after every update."""
    result = subprocess.run(
        [sys.executable, "-m", "ggpo_lightning.cli.train", "--config", str(FSDP), "--data.val_size", "16",
         "--trainer.max_steps", "4", "--trainer.val_check_interval", "4",
         *servers(fleet)], cwd=quickstart, capture_output=True, text=True, timeout=600,
        env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = max((quickstart / "runs" / "fsdp-cpu-2proc").glob("version_*"), key=lambda p: p.stat().st_mtime)
    metrics = list(csv.DictReader(open(run_dir / "metrics.csv")))
    assert json.loads((run_dir / "summary.json").read_text())["optimizer_steps"] == 4
    assert [float(r["train/servers_alive"]) for r in metrics if r.get("train/servers_alive")] == [2.0] * 4
    assert all(float(r["train/staleness"]) == 0 for r in metrics if r.get("train/staleness"))


def two_processes(quickstart: Path, name: str, *args: str, timeout: float) -> subprocess.CompletedProcess:
    """``ggpo-train`` on the FSDP recipe's two processes, under the quickstart's folder, as ``runs/NAME``; a run that
    has not ended after ``timeout`` seconds fails the test (its process group killed)."""
    command = [sys.executable, "-m", "ggpo_lightning.cli.train", "--config", str(FSDP), "--data.val_size", "16",
               "--trainer.logger.init_args.name", name, *args]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(Path(__file__).parent)}  # server_faults
    process = subprocess.Popen(command, cwd=quickstart, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=env, start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, 9)
        stdout, stderr = process.communicate()
        pytest.fail(f"the two-process run {name} did not end within {timeout:g} s; its stderr ends:\n{stderr[-3000:]}")
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def test_two_fsdp_processes_generate_asynchronously_on_the_servers(quickstart, fleet):
    """The async schedule on two trainer processes: rank 0's producer rolls out every rank's share on both servers
    while the learner trains; pushes every 2 updates, so responses are up to 2 updates stale."""
    result = two_processes(quickstart, "async-2proc", "--config", str(ASYNC), "--model.rollout.sync_every", "2",
                           "--model.rollout.max_staleness", "2", "--trainer.max_steps", "8",
                           "--trainer.val_check_interval", "8", *servers(fleet), timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = quickstart / "runs" / "async-2proc" / "version_0"
    metrics = list(csv.DictReader(open(run_dir / "metrics.csv")))
    assert json.loads((run_dir / "summary.json").read_text())["optimizer_steps"] == 8
    assert trained(metrics, "train/servers_alive") == [2.0] * 8
    assert trained(metrics, "train/verifier/total") == [16 * 8.0] * 8  # the whole step's responses, every step
    staleness = trained(metrics, "train/staleness_max")
    assert max(staleness) >= 1 and max(staleness) <= 2, staleness  # stale responses, within the bound


def test_two_processes_with_every_server_gone_end_together(quickstart, fleet):
    """Both servers killed after update 2 of an async run on two processes: every process ends within
    server_timeout plus a bounded margin, exits non-zero with the same one line, and aborted.ckpt is saved."""
    kill = json.dumps({"class_path": "server_faults.KillServers",
                       "init_args": {"pids": [server.pid for server in fleet.servers], "kill_step": 2}})
    try:
        result = two_processes(quickstart, "gone-2proc", "--config", str(ASYNC), "--model.rollout.sync_every", "2",
                               "--model.rollout.max_staleness", "2", "--trainer.max_steps", "12",
                               "--trainer.val_check_interval", "12", "--model.rollout.server_timeout", "5",
                               "--trainer.callbacks+", kill, *servers(fleet), timeout=300)
    finally:
        fleet.restart(0)
        fleet.restart(1)
    assert result.returncode == 1, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("ggpo-train: aborted: ")]
    assert len(lines) == 2 and lines[0] == lines[1], result.stderr[-3000:]  # one line from each process
    assert all(url in lines[0] for url in fleet.urls) and "model.rollout.server_timeout=5 s" in lines[0]
    assert (quickstart / "runs" / "gone-2proc" / "version_0" / "checkpoints" / "aborted.ckpt").exists()


def test_local_servers_start_with_the_run_and_stop_with_it(quickstart, monkeypatch):
    """``servers: local`` starts one server of the run's model (its log in the run's folder) and stops it at the end;
    with ``server_logprobs: false`` (servers that give none) GGPO trains the same, without the drift columns."""
    cli = train(quickstart, monkeypatch, "--model.rollout.engine", "vllm_server", "--model.rollout.servers", "local",
                "--model.rollout.vllm_args", json.dumps({"kv_cache_memory_bytes": 64 << 20}),
                "--model.rollout.server_logprobs", "false",
                "--trainer.max_steps", "3", "--data.val_size", "16", "--trainer.val_check_interval", "3")
    assert summary(cli)["status"] == "completed"
    metrics = rows(cli)
    assert len(trained(metrics, "train/loss")) == 3 and not trained(metrics, "train/kl_behavior_k1")
    log = Path(cli.trainer.log_dir) / "servers" / "server-0.log"
    assert log.exists()  # the server's log in the run's own folder
    fleet = cli.model.engine.fleet
    assert fleet is not None and len(fleet.servers) == 1 and not fleet.servers[0].alive  # stopped with the run


def test_a_killed_local_server_comes_back_and_the_run_finishes(quickstart, monkeypatch):
    """kill -9 of the run's own local server after update 2: the next push starts it again on its port, re-syncs it
    once it answers, and the run finishes; the restart and the re-sync are counted."""
    callback = json.dumps({"class_path": "server_faults.KillServers", "init_args": {"own": [0], "kill_step": 2}})
    cli = train(quickstart, monkeypatch, "--model.rollout.engine", "vllm_server", "--model.rollout.servers", "local",
                "--model.rollout.vllm_args", json.dumps({"kv_cache_memory_bytes": 64 << 20}),
                "--trainer.max_steps", "5", "--data.val_size", "16", "--trainer.val_check_interval", "5",
                "--trainer.callbacks+", callback)
    assert summary(cli)["status"] == "completed" and cli.trainer.global_step == 5
    metrics = rows(cli)
    assert sum(trained(metrics, "train/server_restarts")) == 1 and sum(trained(metrics, "train/server_resyncs")) == 1
    assert trained(metrics, "train/servers_alive")[-1] == 1.0


def test_a_lora_run_publishes_adapters_to_its_local_server(quickstart, monkeypatch):
    """The LoRA quickstart on a local server: the base is pushed once at the start, then one adapter per update
    (``RUN_DIR/adapters/vN``), and the responses carry the adapter's version."""
    cli = run_training(["--config", str(ROOT / "recipes" / "quickstart-lora.yaml"), "--model.model_name_or_path",
                        str(quickstart / "runs" / "quickstart" / "tiny-model"), "--tiny_model", "null",
                        "--synthetic_data", "null",
                        "--data.train_path", str(quickstart / "runs" / "quickstart" / "data" / "train.jsonl"),
                        "--data.val_path", str(quickstart / "runs" / "quickstart" / "data" / "test.jsonl"),
                        "--trainer.logger.init_args.save_dir", str(quickstart / "runs"),
                        "--model.rollout.engine", "vllm_server", "--model.rollout.servers", "local",
                        "--model.rollout.vllm_args", json.dumps({"kv_cache_memory_bytes": 64 << 20}),
                        "--trainer.max_steps", "3", "--data.val_size", "16", "--trainer.val_check_interval", "3"])
    assert summary(cli)["status"] == "completed"
    adapters = Path(cli.trainer.log_dir) / "adapters"
    assert sorted(p.name for p in adapters.iterdir()) == ["v0", "v1", "v2", "v3"]
    assert cli.model.engine.servers[0].adapters == ["v2", "v3"]  # the two newest stay loaded
    assert trained(rows(cli), "train/staleness") == [0.0, 0.0, 0.0]
