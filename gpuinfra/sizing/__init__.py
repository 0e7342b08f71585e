"""Right-sizing: model shapes, per-GPU memory formulas, GPU recommendations, training time.

Modules: :mod:`gpuinfra.sizing.models` (shapes, ``--params`` heuristic),
:mod:`gpuinfra.sizing.memory` (formulas), :mod:`gpuinfra.sizing.recommend` (cheapest fit,
time and cost). Sources: ``shared/reference/sizing-formulas.md`` and the papers it cites.
"""
