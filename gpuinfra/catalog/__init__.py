"""The GPU instance catalog: offers with prices, instance facts, GPU models.

Import from the submodules: :mod:`gpuinfra.catalog.store` (loading),
:mod:`gpuinfra.catalog.model` (row types), :mod:`gpuinfra.catalog.build` (snapshot ->
package data), :mod:`gpuinfra.catalog.refresh_aws` / :mod:`gpuinfra.catalog.refresh_gcp`
(rebuild from the clouds' APIs), :mod:`gpuinfra.catalog.prices` (non-compute prices and usage
defaults, ``data/prices.yaml`` and ``data/usage_defaults.yaml``).
"""
