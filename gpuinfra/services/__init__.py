"""Services the commands call that read stack files, the Pulumi state, buckets or the clouds:
:mod:`~gpuinfra.services.health_report` (``gpuinfra check``), :mod:`~gpuinfra.services.cost_document`
(``gpuinfra cost``), :mod:`~gpuinfra.services.monitoring_sources` (``gpuinfra status``),
:mod:`~gpuinfra.services.catalog_refresh` (``gpuinfra catalog refresh``)
and :mod:`~gpuinfra.services.ladder` (``new --fallback`` / ``up --fallback``). They sit above the
domain packages they use (``health``, ``cost``, ``monitoring``, ``catalog``), which never import
them. Importing this package imports nothing.
"""
