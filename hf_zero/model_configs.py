"""Built-in model shapes for `hf-zero plan` and the benchmark harness: Llama-like configs (1.35B, 8B, tiny), their size
and FLOPs per token."""

import json
from pathlib import Path

from .errors import ConfigError

# Llama-like 1.35B: the model of the baseline table in FIELD_NOTES (random init, no hub needed).
MODELS = {
    "1.35b": dict(hidden_size=2048, num_hidden_layers=24, intermediate_size=5504, vocab_size=32000,
                  num_attention_heads=16, num_key_value_heads=16, max_position_embeddings=4096),
    # Llama-like 8B (Llama-3-8B's shapes with a 32k vocabulary): too big for DDP on an 80 GB GPU
    "8b": dict(hidden_size=4096, num_hidden_layers=32, intermediate_size=14336, vocab_size=32000,
               num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=4096),
    # Big enough that every ZeRO code path runs (several buckets, partitions per layer), small enough for CI.
    "tiny": dict(hidden_size=64, num_hidden_layers=2, intermediate_size=128, vocab_size=256,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512),
}


def resolve_model(model: str) -> tuple[str, dict]:
    """(name, LlamaConfig-style dict) for "1.35b", "tiny" or a path to a transformers config.json."""
    if model in MODELS:
        return model, {"model_type": "llama", **MODELS[model]}
    path = Path(model)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ConfigError(f"--model {model!r} is neither a built-in model ({', '.join(MODELS)}) nor a config.json file")
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"cannot read {str(path)!r} as JSON: {e}") from None
    if not isinstance(data, dict) or "model_type" not in data:
        raise ConfigError(f"{str(path)!r} has no model_type; pass a transformers config.json of a causal LM")
    return path.parent.name or path.stem, data


def build_config(config: dict):
    """A transformers config object from the dict (no hub access)."""
    from transformers import AutoConfig

    data = dict(config)
    return AutoConfig.for_model(data.pop("model_type"), **data)


def matmul_params(shape, tied: bool) -> int:
    """Parameters that take part in a matmul per token: all but the input embedding (a lookup),
    unless the output head shares it (``tie_word_embeddings``)."""
    return shape.params if tied else shape.params - shape.vocab * shape.hidden


def flops_per_token(shape, seq: int, tied: bool = False, frozen_base: bool = False) -> int:
    """Model FLOPs per trained token: 6 N (forward + backward matmuls) + 12 L h seq (attention scores and
    values, counted over the full square as in the Megatron/PaLM formula). Recomputation under gradient
    checkpointing is not counted: this is model FLOP/s, not hardware FLOP/s. A frozen base (LoRA) has no
    weight gradients: 4 N (a LoRA adapter's own matmuls are under 1% and not counted)."""
    return (4 if frozen_base else 6) * matmul_params(shape, tied) + 12 * shape.layers * shape.hidden * seq


def params_text(n: int) -> str:
    return f"{n / 1e9:.3g}B" if n >= 1e9 else f"{n / 1e6:.3g}M"
