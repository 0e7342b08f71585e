"""Model shapes: named open models (``data/models.yaml``, from their HF config.json) or a shape
derived from a parameter count.

``--params`` heuristic (documented, approximate): a decoder-only transformer has about
``12 * L * h**2`` non-embedding parameters (Kaplan et al. 2020, arXiv:2001.08361 section 2.1),
and LLaMA-style models keep ``h / L`` near 128 (LLaMA 7B: 4096/32; 13B: 5120/40). So
``L = round((P / (12 * 128**2)) ** (1/3))``, ``h = 128 * L``, heads of size 128, full
multi-head attention (no GQA: a conservative KV cache) and a 32,000-token vocabulary.
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
DEFAULT_VOCAB = 32000


@dataclass(frozen=True)
class ModelShape:
    """Transformer shape.

    Attributes:
        name: model name or ``<N> params``.
        params: total parameters.
        layers, hidden, heads, kv_heads, vocab: as in the HF config.
        source: where the shape comes from.
    """

    name: str
    params: float
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    vocab: int
    source: str

    @property
    def head_dim(self) -> int:
        """Size of one attention head."""
        return self.hidden // self.heads

    @property
    def layer_params(self) -> float:
        """Parameters of the largest layer: a transformer block, ~12 h^2 (or the embedding if larger)."""
        return max(12 * self.hidden**2, self.vocab * self.hidden)


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
            return ModelShape(model, float(data["params"]), data["layers"], data["hidden"], data["heads"],
                              data["kv_heads"], data["vocab"], f"huggingface.co/{data['repo']} config.json")
    names = known_models()
    close = difflib.get_close_matches(key, names, n=2, cutoff=0.6)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    raise SizingError(f"unknown model {name!r}.{hint} Known models: {', '.join(names)} (or use --params 7B)")


_PARAMS = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMBT]?)\s*$", re.I)
_SCALE = {"": 1, "K": 1e3, "M": 1e6, "B": 1e9, "T": 1e12}


def parse_count(text: str, what: str = "--params") -> float:
    """``7B`` -> 7e9, ``350M`` -> 3.5e8, ``2T`` -> 2e12, ``1e9`` not accepted (use 1B).

    Raises:
        SizingError: malformed or not positive.
    """
    match = _PARAMS.match(text or "")
    if not match or float(match.group(1)) <= 0:
        raise SizingError(f"{what} must look like 7B, 1.3B, 350M or 2T, got {text!r}")
    return float(match.group(1)) * _SCALE[match.group(2).upper()]


def shape_from_params(params: float) -> ModelShape:
    """Shape derived from a parameter count (see module docstring)."""
    layers = max(1, round((params / (12 * ASPECT**2)) ** (1 / 3)))
    hidden = ASPECT * layers
    heads = max(1, hidden // HEAD_DIM)
    label = f"{params / 1e9:g}B params" if params >= 1e9 else f"{params / 1e6:g}M params"
    return ModelShape(label, params, layers, hidden, heads, heads, DEFAULT_VOCAB,
                      "heuristic: 12*L*h^2 parameters, h/L = 128 (Kaplan et al. 2020; LLaMA shapes)")
