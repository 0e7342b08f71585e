"""Cost preview: price every resource of a plan (offline preview or `pulumi preview --json`)
through cost components, like Infracost, with run-length pricing for GPU training.

Modules: :mod:`gpuinfra.cost.estimate`
(resources -> priced lines), :mod:`gpuinfra.cost.report` (totals, JSON, diff),
:mod:`gpuinfra.cost.pulumi_preview` (read `pulumi preview --json`),
and, in the service layer, :mod:`gpuinfra.services.cost_document` (the cost document of a stack file). The price
book is data, in :mod:`gpuinfra.catalog.prices`.
"""
