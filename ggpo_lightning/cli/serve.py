"""``ggpo serve``: vLLM's own OpenAI-compatible server for a model, started the way the trainer needs it.

Contract: runs one server (:func:`~ggpo_lightning.rollouts.fleet.launcher.serve_command`, with the environment of
:func:`~ggpo_lightning.rollouts.fleet.launcher.serve_env`) as a child whose output is this command's own, prints
``ggpo serve: http://HOST:PORT serving MODEL (weight transfer: BACKEND)`` once ``/health`` answers, and waits.
SIGINT or SIGTERM stops the server with all its processes and exits 0. A server that ends by itself after it served
is started again, on one line, up to ``MAX_RESTARTS`` times (the trainer re-syncs it: its weights are the folder's
again); one that ends before it served, or once more, makes this command say so on one line and exit with its code
(128 + N for signal N). Without vLLM, or with a vLLM argument the
trainer owns, it prints one line and exits 2. The server runs in its own process group, so that a terminal's Ctrl-C
reaches it once, through this command; if this command dies without stopping it (``kill -9``), a watcher process
ends the server's whole group (:mod:`~ggpo_lightning.rollouts.fleet.reaper`).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import TYPE_CHECKING, NoReturn

import click

if TYPE_CHECKING:
    from ggpo_lightning.rollouts.fleet.launcher import LocalServer

__all__ = ["serve_command"]


@click.command(context_settings={"ignore_unknown_options": True, "help_option_names": ["-h", "--help"]})
@click.argument("model")
@click.option("--port", type=click.IntRange(1, 65535), default=8000, show_default=True)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (0.0.0.0: all).")
@click.option("--dtype", default=None, help="The weights' dtype in vLLM (default: vLLM's choice, from the model).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--tokenizer", default=None, help="Tokenizer folder or name (default: MODEL).")
@click.option("--lora-rank", type=click.IntRange(min=1), default=None,
              help="Accept runtime LoRA adapters up to this rank (the trainer's model.lora.rank).")
@click.argument("vllm_args", nargs=-1, type=click.UNPROCESSED)
def serve_command(model: str, port: int, host: str, dtype: str | None, seed: int, tokenizer: str | None,
                  lora_rank: int | None, vllm_args: tuple[str, ...]) -> None:
    """Serve MODEL with vLLM for ggpo-train to generate on and push weights to.

    Arguments after `--` go to vLLM as they are (e.g. `-- --max-model-len 4096`); the ones the trainer relies on
    (weight transfer, log-probs mode, host, port, seed, dtype, tokenizer, LoRA) are refused: use the options above.
    """
    from ggpo_lightning.rollouts.fleet import launcher
    from ggpo_lightning.rollouts.config import VLLM_INSTALL_HINT, vllm_available

    if not vllm_available():
        _fail(f"vLLM is not installed: {VLLM_INSTALL_HINT}", 2)
    try:
        argv = launcher.serve_command(model, port, host=host, dtype=dtype, seed=seed, tokenizer=tokenizer,
                                          max_lora_rank=lora_rank, extra_args=vllm_args)
    except ValueError as error:
        _fail(f"error: {error}", 2)
    server = launcher.LocalServer(argv, launcher.serve_env(os.environ, lora=lora_rank is not None),
                                      host=host, port=port)
    requested: list[int] = []

    def request_stop(signum: int, frame: object) -> None:
        requested.append(signum)  # acted on in the loop below; a second signal changes nothing: stop escalates

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)
    server.start()
    _supervise(server, model, requested)
    server.stop()


def _supervise(server: LocalServer, model: str, requested: list[int]) -> None:
    """Announce the server once it answers, and start it again when it ends after it served (up to
    ``MAX_RESTARTS`` times: the trainer re-syncs it); return once a stop is ``requested``, or exit with the code of a
    server that ended before it served, or once too often."""
    from ggpo_lightning.rollouts.fleet import launcher

    announced, served, restarts = False, False, 0
    while not requested:
        code = server.returncode
        if code is not None:
            if not served or restarts >= launcher.MAX_RESTARTS:
                _fail(f"the vLLM server exited with code {code}" + (f" after {restarts} restarts" if restarts else ""),
                      code if code >= 0 else 128 - code)
            restarts += 1
            click.echo(f"ggpo serve: the vLLM server exited with code {code}; starting it again ({restarts} of "
                       f"{launcher.MAX_RESTARTS})", err=True)
            server.stop()  # what is left of its process group
            server.start()
            announced = False
            continue
        try:
            ready = not announced and server.ready()
        except RuntimeError:
            continue  # it ended just now: handled above
        if ready:
            click.echo(f"ggpo serve: {server.url} serving {model} "
                       f"(weight transfer: {launcher.weight_transfer_backend()})")
            announced = served = True
        time.sleep(0.5)


def _fail(message: str, code: int) -> NoReturn:
    click.echo(f"ggpo serve: {message}", err=True)
    sys.exit(code)
