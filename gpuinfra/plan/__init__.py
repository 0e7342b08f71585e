"""What to build, without Pulumi: the cluster plan of a spec and the node software it boots.

``gpuinfra.plan`` turns a validated :class:`gpuinfra.spec.ClusterSpec` into a typed
:class:`gpuinfra.plan.model.ClusterPlan` (network, placement, nodes, storage, identity, outputs and
the cloud-specific part), and renders what the nodes run at boot (AWS user data, GCP startup
script, the node bundle, fabric runtime and host stacks). The Pulumi components in ``blueprints/``
register resources from it; nothing in this package imports Pulumi.
"""
