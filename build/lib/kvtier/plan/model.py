"""A model's KV-cache geometry from its Hugging Face config.json: bytes per token and per LMCache chunk.

    bytes/token = 2 (K and V) x layers x KV heads x head_dim x bytes of the KV dtype

LMCache stores a chunk of `chunk_size` tokens as one object covering every layer. Models whose cache is a
compressed latent (MLA: DeepSeek V2/V3) cache one vector of kv_lora_rank + qk_rope_head_dim per layer and
token instead. Models whose per-layer cache differs (sliding-window or linear-attention layers, KV shared
across layers, state-space layers) are refused with the reason: kvtier cannot size what LMCache stores for them.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Mapping
from dataclasses import dataclass

SHIPPED = pathlib.Path(__file__).resolve().parent / "models"
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}
GIB = 1 << 30


class PlanError(ValueError):
    """A model or hardware description the planner cannot use; the message says why and what to give instead."""


@dataclass(frozen=True)
class ModelKV:
    name: str
    layers: int
    kv_heads: int
    head_dim: int
    kv_bytes: int  # per element of the KV cache
    kv_dtype: str
    parameters: int | None  # None when the config does not say and it cannot be estimated
    weight_bytes_per_parameter: int
    mla_latent: int | None = None  # kv_lora_rank + qk_rope_head_dim for MLA models

    @property
    def bytes_per_token(self) -> int:
        if self.mla_latent is not None:
            return self.layers * self.mla_latent * self.kv_bytes
        return 2 * self.layers * self.kv_heads * self.head_dim * self.kv_bytes

    def chunk_bytes(self, chunk_size: int) -> int:
        return self.bytes_per_token * chunk_size

    @property
    def weights_gib(self) -> float | None:
        return None if self.parameters is None else self.parameters * self.weight_bytes_per_parameter / GIB

    def describe(self) -> str:
        if self.mla_latent is not None:
            shape = f"{self.layers} layers, MLA latent {self.mla_latent}"
        else:
            shape = f"{self.layers} layers, {self.kv_heads} KV heads x {self.head_dim}"
        return f"{self.name} ({shape}, {self.kv_dtype} KV)"


def _text_config(config: Mapping) -> Mapping:
    # Multimodal configs nest the language model's settings.
    if "num_hidden_layers" not in config and isinstance(config.get("text_config"), Mapping):
        return config["text_config"]
    return config


def _refusal(config: Mapping) -> str | None:
    layer_types = config.get("layer_types")
    if isinstance(layer_types, list) and any(t != "full_attention" for t in layer_types):
        kinds = ", ".join(sorted({str(t) for t in layer_types}))
        return f"its layers are not all full attention (layer_types: {kinds}): each kind caches a different size"
    if config.get("use_sliding_window") or config.get("sliding_window_pattern"):
        return "it uses sliding-window attention on some layers: the cache per token differs per layer"
    if config.get("num_kv_shared_layers"):
        return f"it shares KV across layers (num_kv_shared_layers {config['num_kv_shared_layers']})"
    for key in ("hybrid_override_pattern", "layers_block_type", "attn_layer_indices", "ssm_cfg"):
        if config.get(key):
            return f"it mixes attention with state-space or linear layers ({key})"
    return None


def _parameters(config: Mapping, layers: int, heads: int, kv_heads: int, head_dim: int) -> int | None:
    """Dense decoder parameters (attention, gated MLP, embeddings); None for shapes this cannot count."""
    if isinstance(config.get("num_parameters"), int):
        return config["num_parameters"]
    hidden, ffn, vocab = config.get("hidden_size"), config.get("intermediate_size"), config.get("vocab_size")
    if not all(isinstance(v, int) for v in (hidden, ffn, vocab)):
        return None
    if any(config.get(k) for k in ("num_experts", "n_routed_experts", "num_local_experts", "kv_lora_rank")):
        return None  # mixture of experts or MLA: give weights_gib instead
    attention = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
    mlp = 3 * hidden * ffn
    embeddings = vocab * hidden * (1 if config.get("tie_word_embeddings") else 2)
    return layers * (attention + mlp) + embeddings


def from_config(config: Mapping, name: str, kv_cache_dtype: str = "auto") -> ModelKV:
    """The geometry of `config` (a config.json as a dict); `kv_cache_dtype` as vLLM's --kv-cache-dtype."""
    config = _text_config(config)
    refusal = _refusal(config)
    if refusal:
        raise PlanError(f"{name}: not sized, because {refusal}; kvtier sizes full-attention and MLA models only")
    try:
        layers = int(config["num_hidden_layers"])
        heads = int(config["num_attention_heads"])
    except (KeyError, TypeError, ValueError):
        raise PlanError(f"{name}: config.json lacks num_hidden_layers or num_attention_heads") from None
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or config.get("hidden_size", 0) // heads)
    weight_dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    kv_dtype = weight_dtype if kv_cache_dtype in ("auto", "", None) else str(kv_cache_dtype)
    for dtype in (kv_dtype, weight_dtype):
        if dtype not in DTYPE_BYTES:
            raise PlanError(f"{name}: unknown dtype {dtype!r}; known: {', '.join(DTYPE_BYTES)}")
    latent = None
    if config.get("kv_lora_rank"):
        latent = int(config["kv_lora_rank"]) + int(config.get("qk_rope_head_dim") or 0)
    if latent is None and head_dim <= 0:
        raise PlanError(f"{name}: config.json gives neither head_dim nor hidden_size")
    return ModelKV(
        name=name,
        layers=layers,
        kv_heads=kv_heads,
        head_dim=head_dim,
        kv_bytes=DTYPE_BYTES[kv_dtype],
        kv_dtype=kv_dtype,
        parameters=_parameters(config, layers, heads, kv_heads, head_dim),
        weight_bytes_per_parameter=DTYPE_BYTES[weight_dtype],
        mla_latent=latent,
    )


def shipped() -> dict:
    """{name: path} of the configs that ship with kvtier."""
    return {p.stem: p for p in sorted(SHIPPED.glob("*.json"))}


def load(model: str, kv_cache_dtype: str = "auto") -> ModelKV:
    """A shipped model by name (`Qwen3-8B`, `Qwen/Qwen3-8B`, any case) or a config.json (or its directory)."""
    path = pathlib.Path(model)
    if path.is_dir():
        path = path / "config.json"
    if path.is_file():
        try:
            config = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise PlanError(f"{path}: not a readable config.json ({exc})") from None
        return from_config(config, path.parent.name if path.name == "config.json" else path.stem, kv_cache_dtype)
    wanted = model.rsplit("/", 1)[-1].lower()
    for name, shipped_path in shipped().items():
        if name.lower() == wanted:
            return from_config(json.loads(shipped_path.read_text()), name, kv_cache_dtype)
    raise PlanError(
        f"unknown model {model!r}: give a config.json (or the model's directory), or one that ships with kvtier: "
        f"{', '.join(shipped())}"
    )
