"""gpuinfra policy pack (CrossGuard): ``pulumi preview --policy-pack policy``.

Two mandatory stack policies, defined in ``gpuinfra.rules.crossguard`` (tested in-process):

* ``gpuinfra-cloud-rules``: the rules of ``gpuinfra preview`` (gpuinfra/rules), with the node
  type's facts from the installed gpuinfra catalog;
* ``gpuinfra-budget``: the stack's priced $/h (gpuinfra/cost) is at most ``maxPricePerHourUsd``
  from the policy config (``--policy-pack-config``) and no resource is left unpriced; not
  applicable when no limit is configured.

Constructing the ``PolicyPack`` starts the analyzer's gRPC server, so this file only runs
under Pulumi.
"""

from pulumi_policy import EnforcementLevel, PolicyPack

from gpuinfra.rules.crossguard import policies

PolicyPack(name="gpuinfra", enforcement_level=EnforcementLevel.MANDATORY, policies=policies())
