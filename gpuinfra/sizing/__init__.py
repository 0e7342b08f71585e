"""Right-sizing: model shapes, per-GPU memory, GPU recommendations, training time, spot checkpoints.

Modules: :mod:`~gpuinfra.sizing.models` (shapes, ``--params`` heuristic),
:mod:`~gpuinfra.sizing.activations` and :mod:`~gpuinfra.sizing.states` (formulas),
:mod:`~gpuinfra.sizing.memory` (per-GPU breakdown), :mod:`~gpuinfra.sizing.throughput` (time,
communication, MFU), :mod:`~gpuinfra.sizing.checkpoint` (spot plan),
:mod:`~gpuinfra.sizing.recommend` (fit and ranking), :mod:`~gpuinfra.sizing.report` (the
document), :mod:`~gpuinfra.sizing.calibration` (model vs measured rows).
"""
