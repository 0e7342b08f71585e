"""Boot health gate: parse what a node measured, decide pass/fail, store and read the results.

Standard library only in :mod:`~gpuinfra.health.parsers`, :mod:`~gpuinfra.health.gate` and
:mod:`~gpuinfra.health.baselines` (they run on the nodes); :mod:`~gpuinfra.services.health_report` is the
operator side (catalog facts, bucket reads) and may use gpuinfra's dependencies. Importing this
package imports nothing.
"""
