"""New weights into a running vLLM model, in place: vLLM's layer-wise reload, and the output layer tied to the embedding.

After its first load vLLM holds its weights in kernel format (on CPU each linear layer's weight packed for oneDNN, the
weight loaders gone). Its layer-wise reload (``initialize_layerwise_reload`` ... ``finalize_layerwise_reload``)
restores the loaders and re-processes each layer into kernel format as its weights arrive, so no second full copy of
the model is made. A layer that receives nothing keeps its old kernel tensors (vLLM logs ``Failed to load weights``).

**Tied weights.** The output layer of a model with tied embeddings shares the embedding's weight, and on CPU it keeps
a packed copy of it for its matrix product. Whether it is re-processed depends on the stream, not on how the tensors
arrive (all in one ``load_weights`` call in process, one per call on a server): a ``state_dict()`` names the shared
tensor twice (``model.embed_tokens.weight`` and ``lm_head.weight``), and the reload gives each layer a tensor of its
own, so vLLM's loader does not skip ``lm_head.weight`` as an alias and the output layer loads and is re-processed like
any layer. A stream that names the tensor once (``named_parameters()``, a ``save_pretrained`` folder) gives the
output layer nothing: vLLM puts its old kernel tensors back, and it multiplies
with its packed copy of the old embedding (outputs change, but wrongly). :func:`finish_reload` therefore re-processes
every layer that loaded nothing from its (shared, now new) weights.

Runs where vLLM's model is (its worker); imports vLLM when called.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["finish_reload", "keep_held_weights", "start_reload"]


def start_reload(model: torch.nn.Module) -> None:
    """Begin a layer-wise reload of ``model`` (vLLM's): each layer is re-processed as its weights arrive through
    ``model.load_weights``."""
    from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

    initialize_layerwise_reload(model)


def finish_reload(model: torch.nn.Module, model_config: Any) -> None:
    """End the reload :func:`start_reload` began: vLLM's finalisation (layers that loaded nothing get their old kernel
    tensors back), then each layer that loaded nothing is re-processed from its weights (a tied output layer: see the
    module docstring)."""
    from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

    unloaded = _layers_without_weights(model)
    finalize_layerwise_reload(model, model_config)
    for layer in unloaded:  # tied to a layer that did load: re-derive its kernel tensors from the shared weight
        layer.quant_method.process_weights_after_loading(layer)


def keep_held_weights(buffer: torch.Tensor) -> None:
    """Copy out of ``buffer`` the received weights the reload in progress still holds: a layer is processed once all
    its weights arrived, and keeps references to those that came before (an embedding padded past the vocabulary,
    an attention layer processed at the end). Run before ``buffer`` is reused for the next ones."""
    from vllm.model_executor.model_loader.reload.layerwise import LAYERWISE_INFO

    storage = buffer.untyped_storage().data_ptr()
    for info in list(LAYERWISE_INFO.values()):
        for _, arguments in info.loaded_weights:
            for key, value in arguments.arguments.items():
                if isinstance(value, torch.Tensor) and value.untyped_storage().data_ptr() == storage:
                    arguments.arguments[key] = value.clone()


def _layers_without_weights(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The layers with a weight-processing method that got no weight in the reload in progress (e.g. an output layer
    tied to the embedding)."""
    from vllm.model_executor.model_loader.reload.layerwise import get_layerwise_info

    layers = []
    for layer in model.modules():
        info = get_layerwise_info(layer)
        if getattr(layer, "quant_method", None) is not None and info.can_load() and info.load_numel <= 0:
            layers.append(layer)
    return layers
