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
        device_memory_gib: total memory the driver reports to PyTorch
            (``torch.cuda.mem_get_info()[1]``), GiB; None when no report is cited.
        device_memory_source: where ``device_memory_gib`` comes from.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    memory_gib: float = Field(gt=0)
    aliases: tuple[str, ...] = ()
    gcp_accelerator_type: str | None = None
    source: str = Field(min_length=1)
    device_memory_gib: float | None = Field(default=None, gt=0)
    device_memory_source: str | None = None

    @property
    def device_reported_gib(self) -> float:
        """Memory a process can see on this GPU, GiB: the cited device report, else
        ``memory_gib`` x :data:`DEVICE_FRACTION_FALLBACK` (derived, errs low)."""
        if self.device_memory_gib is not None:
            return self.device_memory_gib
        return round(self.memory_gib * DEVICE_FRACTION_FALLBACK, 2)


#: Smallest device-reported / nominal ratio among the cited reports in gpus.json (T4:
#: 14.75 / 16 GiB): used for GPUs without a cited report, so their usable memory errs low.
DEVICE_FRACTION_FALLBACK = 0.9219


@lru_cache(maxsize=1)
def load_gpu_models() -> tuple[GpuModel, ...]:
    """The GPU models shipped with the package, largest memory first."""
    doc = json.loads((PACKAGE_DATA_DIR / "gpus.json").read_text())
    return tuple(GpuModel(**{**g, "aliases": tuple(a.upper() for a in g["aliases"])}) for g in doc["gpus"])


def gpu_model(name: str) -> GpuModel:
    """The model called ``name`` (canonical name).

    Raises:
        CatalogError: no such model in ``gpus.json``.
    """
    for model in load_gpu_models():
        if model.name == name:
            return model
    raise CatalogError(f"unknown GPU model {name!r}; known: {', '.join(m.name for m in load_gpu_models())}")
