"""Right-sizing: model shapes, per-GPU memory, GPU recommendations, training time, spot checkpoints.

Modules: :mod:`~gpuinfra.sizing.models` (shapes, ``--params`` heuristic),
:mod:`~gpuinfra.sizing.activations` and :mod:`~gpuinfra.sizing.states` (formulas),
:mod:`~gpuinfra.sizing.memory` (per-GPU breakdown), :mod:`~gpuinfra.sizing.throughput` (time,
communication, MFU), :mod:`~gpuinfra.sizing.checkpoint` (spot plan),
:mod:`~gpuinfra.sizing.supply` (what can be rented: offers per configuration, fast types),
:mod:`~gpuinfra.sizing.recommend` (fit and ranking), :mod:`~gpuinfra.sizing.report` (the
document), :mod:`~gpuinfra.sizing.calibration` (model vs measured rows).
"""

#: Memory kept free on every GPU, as a fraction of what the model needs (model error, allocator
#: growth between steps). A named setting: ``gpuinfra size --headroom``. Defined here, not in
#: :mod:`~gpuinfra.sizing.recommend`, so the CLI reads the default without loading the catalog.
DEFAULT_HEADROOM_FRACTION = 0.10
