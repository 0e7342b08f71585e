"""GPU models known to gpuinfra: the one place for a GPU's memory and cloud names.

``gpus.json`` holds one record per GPU model. Every other module (offers, sizing, the
blueprints through the spec) reads a GPU's memory from here, never from a price row.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from gpuinfra.errors import CatalogError

PACKAGE_DATA_DIR = Path(__file__).parent / "data"


class GpuModel(BaseModel):
    """A GPU model (``gpus.json``).

    Attributes:
        name: canonical name (``A100-80GB``).
        memory_gib: memory per GPU in GiB (source in ``gpus.json`` ``_about`` and ``source``).
        aliases: other spellings accepted by the request grammar (upper case).
        gcp_accelerator_type: Compute Engine accelerator type
            (cloud.google.com/compute/docs/gpus), or None when GCP lacks the model.
        source: where ``memory_gib`` comes from.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    memory_gib: float = Field(gt=0)
    aliases: tuple[str, ...] = ()
    gcp_accelerator_type: str | None = None
    source: str = Field(min_length=1)


@lru_cache(maxsize=1)
def load_gpu_models() -> tuple[GpuModel, ...]:
    """The GPU models shipped with the package, largest memory first."""
    doc = json.loads((PACKAGE_DATA_DIR / "gpus.json").read_text())
    return tuple(
        GpuModel(**{**g, "aliases": tuple(a.upper() for a in g["aliases"])})
        for g in doc["gpus"]
    )


def gpu_model(name: str) -> GpuModel:
    """The model called ``name`` (canonical name).

    Raises:
        CatalogError: no such model in ``gpus.json``.
    """
    for model in load_gpu_models():
        if model.name == name:
            return model
    raise CatalogError(f"unknown GPU model {name!r}; known: {', '.join(m.name for m in load_gpu_models())}")
