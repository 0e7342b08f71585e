"""Model shapes: named open models (``data/models.yaml``, from their HF config.json) or a shape
derived from a parameter count.

``--params`` heuristic (documented, approximate): a decoder-only transformer has about
``12 * L * h**2`` non-embedding parameters (Kaplan et al. 2020, arXiv:2001.08361 section 2.1),
and LLaMA-style models keep ``h / L`` near 128 (LLaMA 7B: 4096/32; 13B: 5120/40). So
``L = round((P / (12 * 128**2)) ** (1/3))``, ``h = 128 * L``, heads of size 128. The rest follows
the current open 7B-405B models (LLaMA 3, Mistral, Qwen2.5 configs): SwiGLU MLP with
``ffn = 3.5 h`` (Llama-3.1-8B: 14336 / 4096), grouped-query attention with 8 KV heads (LLaMA 3,
Mistral, Qwen2.5-72B; KV memory only depends on their count, so the grouping need not divide the heads) and the LLaMA 3
vocabulary of 128,256 tokens (the larger vocabulary errs high on logits memory).
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import yaml

from gpuinfra.errors import SizingError

DATA = Path(__file__).parent / "data" / "models.yaml"
HEAD_DIM = 128
ASPECT = 128
DEFAULT_VOCAB = 128256
DEFAULT_KV_HEADS = 8
FFN_RATIO = 3.5
MAX_PARAMS = 1e15  # 1000T: beyond any model; bigger --params is a typo


@dataclass(frozen=True)
class ModelShape:
    """Transformer shape.

    Attributes:
        name: model name or ``<N> params``.
        params: total parameters.
        layers, hidden, heads, kv_heads, vocab: as in the HF config.
        source: where the shape comes from.
        ffn: MLP intermediate size.
        mlp: ``swiglu`` | ``gelu`` | ``gelu_new`` (GPT-2's tanh GELU in Python ops); norm: ``rmsnorm`` | ``layernorm`` (models.yaml header).
        tied: input embedding and LM head share one matrix.
        positions: learned absolute position embeddings (0 for RoPE/ALiBi).
        dropout: the reference implementation trains with dropout.
        head: ``lm`` | ``classifier``.
        fused_qkv: q, k and v come from one linear layer (GPT-2 ``c_attn``).
        context: longest sequence the model was trained for, tokens (``max_position_embeddings``
            / ``n_positions`` of its config.json); 0 when unknown (a ``--params`` shape).
    """

    name: str
    params: float
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    vocab: int
    source: str
    ffn: int = 0
    mlp: str = "swiglu"
    norm: str = "rmsnorm"
    tied: bool = False
    positions: int = 0
    dropout: bool = False
    head: str = "lm"
    fused_qkv: bool = False
    context: int = 0

    @property
    def head_dim(self) -> int:
        """Size of one attention head."""
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        """Width of K (and of V): KV heads x head size."""
        return self.kv_heads * self.head_dim

    @property
    def ffn_size(self) -> int:
        """MLP intermediate size (4 h when the data file has none)."""
        return self.ffn or 4 * self.hidden

    @property
    def block_params(self) -> float:
        """Linear parameters of one transformer block: q, o (h x h), k, v (h x kv), the MLP
        (3 h f gated, 2 h f otherwise)."""
        h = self.hidden
        mlp = (3 if self.mlp == "swiglu" else 2) * h * self.ffn_size
        return 2 * h * h + 2 * h * self.kv_dim + mlp

    @property
    def embedding_params(self) -> float:
        """Token (and learned position) embeddings."""
        return (self.vocab + self.positions) * self.hidden

    @property
    def head_params(self) -> float:
        """LM-head parameters not shared with the embedding (0 when tied or no LM head)."""
        return 0.0 if self.tied or self.head != "lm" else float(self.vocab * self.hidden)

    @property
    def quantizable_params(self) -> float:
        """Parameters in the blocks' linear layers: what bitsandbytes int8/4-bit quantizes
        (embeddings and the LM head stay 16-bit: transformers ``llm_int8_skip_modules`` keeps
        ``lm_head``; ``nn.Embedding`` is not replaced)."""
        return max(0.0, self.params - self.embedding_params - self.head_params)

    @property
    def largest_matrix_params(self) -> float:
        """Largest single linear weight of a block (MLP: h x ffn)."""
        return float(self.hidden * max(self.ffn_size, self.hidden))

    @property
    def layer_params(self) -> float:
        """Parameters of the largest module FSDP/ZeRO-3 gathers at once: a transformer block, or
        the embedding if larger."""
        return max(self.block_params, self.vocab * self.hidden)


@lru_cache(maxsize=1)
def _known() -> dict[str, dict]:
    return yaml.safe_load(DATA.read_text())


def known_models() -> list[str]:
    """Names of the models with shapes in the data file."""
    return sorted(_known())


def get_model(name: str) -> ModelShape:
    """Shape of a named model (case-insensitive, aliases accepted).

    Raises:
        SizingError: unknown name, with the closest matches and the known list.
    """
    key = name.strip().lower()
    for model, data in _known().items():
        if key == model or key in data.get("aliases", []):
            return ModelShape(
                model,
                float(data["params"]),
                data["layers"],
                data["hidden"],
                data["heads"],
                data["kv_heads"],
                data["vocab"],
                f"huggingface.co/{data['repo']} config.json",
                ffn=data.get("ffn", 0),
                mlp=data.get("mlp", "swiglu"),
                norm=data.get("norm", "rmsnorm"),
                tied=bool(data.get("tied", False)),
                positions=data.get("positions", 0),
                dropout=bool(data.get("dropout", False)),
                head=data.get("head", "lm"),
                fused_qkv=bool(data.get("fused_qkv", False)),
                context=int(data.get("context", 0)),
            )
    names = known_models()
    close = difflib.get_close_matches(key, names, n=2, cutoff=0.6)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    raise SizingError(f"unknown model {name!r}.{hint} Known models: {', '.join(names)} (or use --params 7B)")


_PARAMS = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMBT]?)\s*$", re.I)
_SCALE = {"": 1, "K": 1e3, "M": 1e6, "B": 1e9, "T": 1e12}


def parse_count(text: str, what: str = "--params") -> float:
    """``7B`` -> 7e9, ``350M`` -> 3.5e8, ``2T`` -> 2e12, ``1e9`` not accepted (use 1B).

    Raises:
        SizingError: malformed, not positive, or (``--params``) above 1000T.
    """
    match = _PARAMS.match(text or "")
    if not match or float(match.group(1)) <= 0:
        raise SizingError(f"{what} must look like 7B, 1.3B, 350M or 2T, got {text!r}")
    value = float(match.group(1)) * _SCALE[match.group(2).upper()]
    if what == "--params" and value > MAX_PARAMS:
        raise SizingError(f"--params must be at most 1000T, got {text!r}")
    return value


def shape_from_params(params: float) -> ModelShape:
    """Shape derived from a parameter count (see module docstring)."""
    layers = max(1, round((params / (12 * ASPECT**2)) ** (1 / 3)))
    hidden = ASPECT * layers
    heads = max(1, hidden // HEAD_DIM)
    kv_heads = min(heads, DEFAULT_KV_HEADS)
    label = f"{params / 1e9:g}B params" if params >= 1e9 else f"{params / 1e6:g}M params"
    return ModelShape(
        label,
        params,
        layers,
        hidden,
        heads,
        kv_heads,
        DEFAULT_VOCAB,
        "heuristic: 12*L*h^2 parameters, h/L = 128 (Kaplan et al. 2020); SwiGLU, 8 KV heads, "
        "128k vocabulary (LLaMA 3 shapes)",
        ffn=int(FFN_RATIO * hidden),
    )
