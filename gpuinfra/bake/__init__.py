"""Prebaked machine images and training containers: ``gpuinfra image bake``.

A *bake* is its own Pulumi stack of the gpuinfra project (``stacks/Pulumi.<name>.yaml`` with the
config value ``gpuinfra:bake``, a :class:`~gpuinfra.bake.model.BakeSpec`); the program
(:mod:`blueprints.program`) builds it with :class:`blueprints.aws.bake.AwsImageBake` (EC2 Image
Builder: an AMI and the training container in ECR) or :class:`blueprints.gcp.bake.GcpImageBake`
(Cloud Build running Packer's ``googlecompute`` builder, the container in Artifact Registry).

Layers: :mod:`~gpuinfra.bake.model` (the spec and the pinned software manifest),
:mod:`~gpuinfra.bake.plan` (request -> validated spec, pure), :mod:`~gpuinfra.bake.render`
(component documents, Packer template, build steps, pure), :mod:`~gpuinfra.bake.stack` (stack
files: write a bake, record its result, hand a baked image to ``gpuinfra new``),
:mod:`~gpuinfra.bake.preview` (offline preview under Pulumi mocks), :mod:`~gpuinfra.bake.deploy`
(``gpuinfra up`` / ``down`` / ``image record`` of a bake) with :mod:`~gpuinfra.bake.gcp_api` (its
Pub/Sub and Compute REST calls). Every version comes from the one place that pins it for boot-time installs
(:mod:`gpuinfra.plan.fabric`, :mod:`gpuinfra.plan.fabric_host`): a bake never carries its
own copy of a version or an install step.
"""

#: Key of the bake spec in a stack file (``gpuinfra:bake``) and in ``pulumi.Config("gpuinfra")``.
BAKE_CONFIG_KEY = "bake"
#: Key of a baked image's manifest in a cluster's stack file (``gpuinfra:image``).
IMAGE_CONFIG_KEY = "image"
