"""What keeps a vLLM server from serving a run, checked before the run loads its weights (``ggpo-train``'s preflight):
one line per problem, each with the flag or setting that fixes it."""

from __future__ import annotations

from ggpo_lightning.rollouts.fleet.engine import GENERATE_ROUTE, short_error

__all__ = ["server_errors"]


def server_errors(url: str, tokenizer, context: int, lora_rank: int | None = None, timeout: float = 10.0) -> list[str]:
    """What keeps the server at ``url`` from serving this run, one line each (empty: none): it does not answer; its
    RL routes are off (``VLLM_SERVER_DEV_MODE=1``); it lacks a flag the trainer needs (``--enable-scale-out``,
    ``--weight-transfer-config``, ``--logprobs-mode raw_logprobs``); its context is shorter than ``context`` tokens;
    its tokenizer is not ``tokenizer`` (the same text, other token ids); a LoRA run's (``lora_rank``) server takes no
    runtime adapters of that rank. A server of another architecture is refused by the first push (its weight
    names)."""
    import requests

    url = url.rstrip("/")
    try:
        requests.get(url + "/health", timeout=timeout).raise_for_status()
        info = requests.get(url + "/server_info", params={"config_format": "json"}, timeout=timeout)
        generate = requests.post(url + GENERATE_ROUTE, json={}, timeout=timeout)
        sample = tokenizer.decode(list(range(min(len(tokenizer), 512))))
        tokens = requests.post(url + "/tokenize", json={"prompt": sample, "add_special_tokens": False},
                               timeout=timeout)
    except requests.RequestException as error:
        return [f"{url} does not answer ({short_error(error)}); start it with `ggpo serve MODEL`"]
    if info.status_code == 404:
        return [f"{url} runs without its RL routes: start it with VLLM_SERVER_DEV_MODE=1 (`ggpo serve` sets it)"]
    errors = []
    config = info.json()["vllm_config"]
    model = config["model_config"]
    if generate.status_code in (403, 404):
        errors.append(f"{url} runs without vLLM's token-in-token-out route: start it with --enable-scale-out")
    if not (config.get("weight_transfer_config") or {}).get("backend"):
        errors.append(f"{url} runs without a weight-transfer backend: start it with --weight-transfer-config "
                      "'{\"backend\": \"nccl\"}' (GPUs) or ggpo_gloo (CPU; `ggpo serve` sets it)")
    if model.get("logprobs_mode") != "raw_logprobs":
        errors.append(f"{url} reports {model.get('logprobs_mode')} log-probs: start it with --logprobs-mode "
                      "raw_logprobs (the behavior policy's, at temperature 1)")
    if int(model.get("max_model_len") or 0) < context:
        errors.append(f"{url} serves {model.get('max_model_len')} tokens, the run needs {context} (the longest prompt "
                      "plus max_new_tokens): start it with a larger --max-model-len")
    lora = config.get("lora_config") or {}
    if lora_rank is not None and int(lora.get("max_lora_rank") or 0) < lora_rank:
        errors.append(f"{url} takes no runtime LoRA adapters of rank {lora_rank}: start it with `ggpo serve --lora-rank "
                      f"{lora_rank}` (VLLM_ALLOW_RUNTIME_LORA_UPDATING=True --enable-lora --max-lora-rank)")
    if tokens.status_code != 200 or tokens.json().get("tokens") != tokenizer.encode(sample, add_special_tokens=False):
        errors.append(f"{url} serves {model.get('model')!r}, whose tokenizer is not this run's model's")
    return errors
