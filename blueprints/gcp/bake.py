"""``gpuinfra:gcp:ImageBake``: a GCP image bake the way Cluster Toolkit builds images (Packer's
``googlecompute`` builder), run by Cloud Build.

Children (``<name>-<role>``):

* ``build-sa`` and its project roles: ``roles/compute.instanceAdmin.v1`` and
  ``roles/iam.serviceAccountUser`` (what Packer's googlecompute builder needs to create the build
  VM and image: developer.hashicorp.com/packer/integrations/hashicorp/googlecompute, "Running
  outside of Google Cloud" / required roles), ``roles/logging.logWriter`` (Cloud Build with a
  user-specified service account writes its logs: cloud.google.com/build/docs/securing-builds/configure-user-specified-service-accounts);
  read on the bake's bucket and write on its repository only.
* ``files`` bucket (uniform access, public access prevention enforced) holding the Packer
  template and the scripts it provisions (:func:`gpuinfra.bake.render.packer_build`).
* ``repository``: Artifact Registry ``DOCKER`` repository with immutable tags, where the build
  mirrors the pinned container base.
* ``run`` Pub/Sub topic and ``trigger``: a Cloud Build trigger with the build inline
  (:func:`gpuinfra.bake.render.cloud_build_steps`); ``gcloud pubsub topics publish <topic>``
  starts a bake (cloud.google.com/build/docs/automate-builds-pubsub-events).

Argument names and valid values: pulumi-gcp 10 Args (``provider-valid-values`` rule).
"""

from __future__ import annotations

import functools

import pulumi
import pulumi_gcp as gcp

from gpuinfra.bake.model import BakeSpec
from gpuinfra.bake.render import PackerBuild, cloud_build_steps, packer_build
from gpuinfra.plan.naming import child

TYPE_TOKEN = "gpuinfra:gcp:ImageBake"
PROJECT_ROLES = ("roles/compute.instanceAdmin.v1", "roles/iam.serviceAccountUser", "roles/logging.logWriter")
#: Longest a bake may run (Cloud Build ``timeout``; an A3 Mega DKMS build plus a 20 GB pull).
BUILD_TIMEOUT = "7200s"
_PREFIX = "bake"


def _build_file(build: PackerBuild, file: str) -> str:
    """One file of the Packer build: ``image.pkr.hcl`` is its template, the rest its scripts."""
    return build.template if file == "image.pkr.hcl" else build.files[file]


class GcpImageBake(pulumi.ComponentResource):
    """The Cloud Build + Packer bake of ``spec`` (module docstring lists the children).

    Raises:
        ValueError: a non-GCP spec.
    """

    def __init__(self, name: str, spec: BakeSpec, opts: pulumi.ResourceOptions | None = None):
        if spec.cloud != "gcp":
            raise ValueError(f"GcpImageBake needs a gcp bake, got {spec.cloud!r}")
        super().__init__(TYPE_TOKEN, name, None, opts)
        m = spec.manifest
        project = spec.gcp_project
        labels = {"gpuinfra-stack": spec.stack, "gpuinfra-kind": "bake", **m.gcp_labels()}
        kids = pulumi.ResourceOptions(parent=self)

        account = gcp.serviceaccount.Account(
            child(name, "build-sa"),
            account_id=f"gb-{spec.stack}"[:30],
            display_name=f"gpuinfra bake {spec.stack}",
            project=project,
            opts=kids,
        )
        for role in PROJECT_ROLES:
            gcp.projects.IAMMember(
                child(name, role.split("/")[1].replace(".", "-").lower()),
                project=project,
                role=role,
                member=account.member,
                opts=kids,
            )
        bucket = gcp.storage.Bucket(
            child(name, "files"),
            location=spec.region.upper(),
            project=project,
            uniform_bucket_level_access=True,
            public_access_prevention="enforced",
            force_destroy=True,
            labels=labels,
            opts=kids,
        )
        gcp.storage.BucketIAMMember(
            child(name, "files-read"),
            bucket=bucket.name,
            role="roles/storage.objectViewer",
            member=account.member,
            opts=kids,
        )
        repository = gcp.artifactregistry.Repository(
            child(name, "repository"),
            repository_id=f"gpuinfra-{spec.stack}",
            format="DOCKER",
            location=spec.region,
            project=project,
            description=f"gpuinfra bake {spec.stack}: training container",
            docker_config=gcp.artifactregistry.RepositoryDockerConfigArgs(immutable_tags=True),
            labels=labels,
            opts=kids,
        )
        gcp.artifactregistry.RepositoryIamMember(
            child(name, "repository-write"),
            project=project,
            location=spec.region,
            repository=repository.name,
            role="roles/artifactregistry.writer",
            member=account.member,
            opts=kids,
        )
        registry_host = f"{spec.region}-docker.pkg.dev"
        container = f"{registry_host}/{project}/gpuinfra-{spec.stack}/train:{m.sha256[:12]}"
        files = account.email.apply(lambda email: packer_build(spec, email, container, registry_host))
        names = [
            "image.pkr.hcl",
            *packer_build(spec, "preview@example.iam.gserviceaccount.com", container, registry_host).files,
        ]
        for file in names:
            gcp.storage.BucketObject(
                child(name, file.replace(".", "-")),
                bucket=bucket.name,
                name=f"{_PREFIX}/{file}",
                content=files.apply(functools.partial(_build_file, file=file)),
                opts=kids,
            )
        topic = gcp.pubsub.Topic(
            child(name, "run"), name=f"gpuinfra-{spec.stack}-run", project=project, labels=labels, opts=kids
        )
        self.trigger = gcp.cloudbuild.Trigger(
            child(name, "trigger"),
            name=f"gpuinfra-{spec.stack}",
            project=project,
            location="global",
            description=f"gpuinfra bake {spec.stack}: Packer googlecompute image + container mirror",
            pubsub_config=gcp.cloudbuild.TriggerPubsubConfigArgs(topic=topic.id),
            service_account=account.email.apply(lambda e: f"projects/{project}/serviceAccounts/{e}"),
            build=gcp.cloudbuild.TriggerBuildArgs(
                steps=bucket.name.apply(
                    lambda b: [
                        gcp.cloudbuild.TriggerBuildStepArgs(id=s["id"], name=s["name"], args=s["args"])
                        for s in cloud_build_steps(b, _PREFIX, m.container_base, container)
                    ]
                ),
                timeout=BUILD_TIMEOUT,
                options=gcp.cloudbuild.TriggerBuildOptionsArgs(logging="CLOUD_LOGGING_ONLY"),
                tags=["gpuinfra", "bake"],
            ),
            opts=kids,
        )
        self.container = container
        self._stack, self._project = spec.stack, project
        self.image_family = f"projects/{project}/global/images/family/gpuinfra-{spec.stack}"
        self.topic = topic
        self.register_outputs(
            {"image_family": self.image_family, "container_image": container, "manifest_sha256": m.sha256}
        )

    def exports(self) -> dict[str, object]:
        """Stack outputs: the image family the builds add to, the container tag, the build's
        Pub/Sub topic (``gpuinfra up`` publishes to it), how to start a bake by hand and how to
        record it."""
        return {
            "image_family": self.image_family,
            "container_image": self.container,
            "build_topic": self.topic.id,
            "run_command": self.topic.name.apply(lambda t: f"gcloud pubsub topics publish {t} --message=bake"),
            "record_command": f"gpuinfra image record {self._stack} --from-outputs",
        }
