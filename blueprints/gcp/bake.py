"""``gpuinfra:gcp:ImageBake``: a GCP image bake the way Cluster Toolkit builds images (Packer's
``googlecompute`` builder), run by Cloud Build, inside the bake stack's own network.

Children (``<name>-<role>``):

* ``network`` + ``subnet`` (Private Google Access on), ``router`` + ``nat`` (Cloud NAT, the
  cluster's own :func:`blueprints.gcp.network.cloud_nat`: the build downloads packages, the
  EFA/TCPX host pieces and the container base), ``allow-iap-ssh`` (TCP 22
  from IAP's TCP-forwarding range :data:`~gpuinfra.plan.gcp.IAP_SSH_RANGE`, to the Packer VM's
  network tag only: cloud.google.com/iap/docs/using-tcp-forwarding#create-firewall-rule). No
  other ingress; the Packer VM has no external IP (:func:`gpuinfra.bake.render.packer_build`).
  The bake needs no ``default`` network.
* ``build-sa``: Cloud Build runs the bake as it; ``vm-sa``: the Packer VM runs as it (it only
  pulls the training container: reader on the bake's repository).
* The build service account's grants, each as narrow as the API allows (:data:`BUILD_VM_PERMISSIONS`
  lists what Packer calls and why):

  - ``build-vm`` (custom role :data:`BUILD_VM_PERMISSIONS`, project binding with a condition,
    :func:`build_vm_condition`): the Packer VM and its boot disk by their one exact name, the
    bake's images by the family's name prefix, the pinned base image by its exact name.
  - ``build-read`` (custom role :data:`BUILD_READ_PERMISSIONS`, project binding, no condition):
    zone, machine type and operation reads, which IAM checks on the project, not on a resource
    a condition could name.
  - ``logging.logWriter`` on the project: Cloud Build with a user-specified service account
    writes the build log to Cloud Logging (cloud.google.com/build/docs/securing-builds/configure-user-specified-service-accounts);
    log writes are project resources.
  - ``iam.serviceAccountUser`` on ``vm-sa`` only (``serviceaccount.IAMMember``): Packer creates
    the VM as that account (iam.serviceAccounts.actAs on it); never project-wide, where it
    would let the build start VMs as any account of the project.
  - ``compute.networkUser`` on the bake's ``subnet`` only: ``compute.subnetworks.use`` for the
    VM's interface.
  - ``iap.tunnelResourceAccessor`` on the project's IAP tunnel resource, condition
    ``destination.port == 22`` (cloud.google.com/iap/docs/using-tcp-forwarding, "Grant
    permissions"): Packer's ``use_iap`` tunnel to the VM; the googlecompute docs ask for the
    role at project level (packer-plugin-googlecompute ``.web-docs/README.md``, "Running on
    Google Cloud": instanceAdmin.v1, serviceAccountUser, iap.tunnelResourceAccessor); the VM
    does not exist before the build, so no instance-level binding can name it, and IAP is not
    among the services whose resource-name attribute a condition can test
    (cloud.google.com/iam/docs/configuring-resource-based-access lists them), so the condition
    cannot name the VM either: IAP documents ``destination.ip`` / ``destination.port`` for TCP
    forwarding. What the port-22 tunnel to another VM of the project gives is a TCP connection
    to its sshd, and only where that VM's firewall admits IAP's range: no login, since this
    account can set SSH keys (``instances.setMetadata``) on its own Packer VM only (``build-vm``
    condition).
  - read on the bake's bucket, write on its repository.

  Packer's documented roles (``compute.instanceAdmin.v1`` + ``iam.serviceAccountUser`` on the
  project) would let a build that runs third-party images start VMs as any service account of
  the project; the grants above are their subset for this one VM.
* ``files`` bucket (uniform access, public access prevention enforced) holding the Packer
  template and the scripts it provisions (:func:`gpuinfra.bake.render.packer_build`).
* ``repository``: Artifact Registry ``DOCKER`` repository with immutable tags, where the build
  mirrors the pinned container base.
* ``run`` Pub/Sub topic and ``trigger``: a Cloud Build trigger with the build inline
  (:func:`gpuinfra.bake.render.cloud_build_steps`); ``gcloud pubsub topics publish <topic>``
  starts a bake (cloud.google.com/build/docs/automate-builds-pubsub-events).

Needs the IAP API (``iap.googleapis.com``) enabled in the project, as Packer's ``use_iap`` does.
Argument names and valid values: pulumi-gcp 10 Args (``provider-valid-values`` rule).
"""

from __future__ import annotations

import functools

import pulumi
import pulumi_gcp as gcp

from blueprints.gcp.network import cloud_nat
from gpuinfra.bake.model import BakeSpec
from gpuinfra.bake.render import (
    BUILD_VM_TAG,
    PackerBuild,
    cloud_build_steps,
    image_family,
    image_name_prefix,
    packer_build,
    packer_instance_name,
)
from gpuinfra.plan.gcp import IAP_SSH_RANGE, SYSTEM_CIDR
from gpuinfra.plan.naming import child

TYPE_TOKEN = "gpuinfra:gcp:ImageBake"
#: Project-level roles of the build service account without a condition, each because its
#: permissions are checked on the project (module docstring).
PROJECT_ROLES = ("roles/logging.logWriter",)
#: What Packer's googlecompute builder (v1.1.6, lib/common/driver_gce.go) does to the build VM,
#: its disk and the image, as Compute Engine permissions (each REST method's "IAM permissions",
#: cloud.google.com/compute/docs/reference/rest/v1): ``instances.insert`` (instances.create with
#: setMetadata/setServiceAccount/setLabels/setTags for the SSH key, the VM's account, labels and
#: the network tag; disks.create for the boot disk; images.useReadOnly on the source image),
#: ``instances.get`` / ``getSerialPortOutput`` (state, startup script), ``setMetadata``,
#: ``instances.delete``, ``disks.get`` / ``disks.delete``, ``images.insert`` from the disk
#: (images.create, disks.useReadOnly; images.setLabels for the labels in its body: the builder
#: never calls images.setLabels on its own), ``images.get`` (the existing-image check and the result).
#: ``gcloud compute start-iap-tunnel`` reads the instance (instances.get).
BUILD_VM_PERMISSIONS = (
    "compute.disks.create",
    "compute.disks.delete",
    "compute.disks.get",
    "compute.disks.setLabels",
    "compute.disks.use",
    "compute.disks.useReadOnly",
    "compute.images.create",
    "compute.images.get",
    "compute.images.setLabels",
    "compute.images.useReadOnly",
    "compute.instances.create",
    "compute.instances.delete",
    "compute.instances.get",
    "compute.instances.getSerialPortOutput",
    "compute.instances.setLabels",
    "compute.instances.setMetadata",
    "compute.instances.setServiceAccount",
    "compute.instances.setTags",
)
#: Reads Packer makes that no resource-name condition can scope (``zones.get``,
#: ``machineTypes.get``, and polling the zone/global operations its calls return).
BUILD_READ_PERMISSIONS = (
    "compute.globalOperations.get",
    "compute.machineTypes.get",
    "compute.zoneOperations.get",
    "compute.zones.get",
)
#: Longest a bake may run (Cloud Build ``timeout``; an A3 Mega DKMS build plus a 20 GB pull).
BUILD_TIMEOUT = "7200s"
_PREFIX = "bake"


def _build_file(build: PackerBuild, file: str) -> str:
    """One file of the Packer build: ``image.pkr.hcl`` is its template, the rest its scripts."""
    return build.template if file == "image.pkr.hcl" else build.files[file]


def build_vm_condition(project: str, zone: str, stack: str, base_image: str) -> str:
    """CEL condition of the ``build-vm`` binding: the Packer VM and its disk by their exact
    name (:func:`gpuinfra.bake.render.packer_instance_name`), images whose name starts with
    ``gpuinfra-<stack>--`` (:func:`gpuinfra.bake.render.image_name_prefix`; Packer names them
    ``<prefix><UTC time>``), and
    the pinned base image by its exact name when it is in the bake's project (a public base is
    readable by every account). Resource names: cloud.google.com/iam/docs/conditions-resource-attributes#resource-name
    (Compute Engine ``projects/P/zones/Z/instances/N``, ``.../disks/N``, ``projects/P/global/images/N``).

    Only functions IAM documents for ``resource.name`` are used (``==`` and ``startsWith``:
    cloud.google.com/iam/docs/conditions-attribute-reference#resource-name). The image prefix is
    self-delimiting (no stack name holds ``--``: see :func:`~gpuinfra.bake.render.image_name_prefix`),
    so no other bake's image name starts with it: this account creates and reads its own bake's
    images, never another bake's, and deletes none. An image's family is chosen by its creator,
    so ``image record`` goes by the name prefix too, not the family alone (:mod:`gpuinfra.bake.deploy`).

    Raises:
        ValueError: see :func:`~gpuinfra.bake.render.image_name_prefix`.
    """
    vm = packer_instance_name(stack)
    clauses = [
        f'resource.name == "projects/{project}/zones/{zone}/instances/{vm}"',
        f'resource.name == "projects/{project}/zones/{zone}/disks/{vm}"',
        f'(resource.type == "compute.googleapis.com/Image" && '
        f'resource.name.startsWith("projects/{project}/global/images/{image_name_prefix(stack)}"))',
    ]
    if base_image.startswith(f"projects/{project}/global/images/"):
        clauses.append(f'resource.name == "{base_image}"')
    return " || ".join(clauses)


def _role_id(prefix: str, stack: str) -> str:
    """Custom role id ``<prefix>_<stack with _>`` (ids: ``[a-zA-Z0-9_.]{3,64}``). The prefixes
    ``gpuinfrabake`` / ``gpuinfrabakeread`` keep bake roles apart from a cluster's ``gpuinfra_<stack>``."""
    return f"{prefix}_{stack.replace('-', '_')}"[:64]


class GcpImageBake(pulumi.ComponentResource):
    """The Cloud Build + Packer bake of ``spec`` (module docstring lists the children).

    Raises:
        ValueError: a non-GCP spec, or one without a project.
    """

    def __init__(self, name: str, spec: BakeSpec, opts: pulumi.ResourceOptions | None = None):
        if spec.cloud != "gcp":
            raise ValueError(f"GcpImageBake needs a gcp bake, got {spec.cloud!r}")
        super().__init__(TYPE_TOKEN, name, None, opts)
        m = spec.manifest
        project = spec.gcp_project
        if not project:
            raise ValueError("GcpImageBake needs the bake's gcp_project")
        labels = {"gpuinfra-stack": spec.stack, "gpuinfra-kind": "bake", **m.gcp_labels()}
        kids = pulumi.ResourceOptions(parent=self)

        account = gcp.serviceaccount.Account(
            child(name, "build-sa"),
            account_id=f"gb-{spec.stack}"[:30],
            display_name=f"gpuinfra bake {spec.stack}",
            project=project,
            opts=kids,
        )
        vm_account = gcp.serviceaccount.Account(
            child(name, "vm-sa"),
            account_id=f"gv-{spec.stack}"[:30],
            display_name=f"gpuinfra bake {spec.stack}: Packer VM",
            project=project,
            opts=kids,
        )
        subnet = self._network(name, spec, project, kids)
        self._grants(name, spec, project, account, vm_account, subnet, kids)
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
        gcp.artifactregistry.RepositoryIamMember(
            child(name, "repository-read"),
            project=project,
            location=spec.region,
            repository=repository.name,
            role="roles/artifactregistry.reader",
            member=vm_account.member,
            opts=kids,
        )
        registry_host = f"{spec.region}-docker.pkg.dev"
        container = f"{registry_host}/{project}/gpuinfra-{spec.stack}/train:{m.sha256[:12]}"
        files = pulumi.Output.all(vm_account.email, subnet.id).apply(
            lambda args: packer_build(spec, args[0], container, registry_host, args[1])
        )
        names = [
            "image.pkr.hcl",
            *packer_build(
                spec,
                "preview@example.iam.gserviceaccount.com",
                container,
                registry_host,
                "projects/p/regions/r/subnetworks/s",
            ).files,
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
                        gcp.cloudbuild.TriggerBuildStepArgs(
                            id=s["id"], name=s["name"], args=s["args"], entrypoint=s.get("entrypoint")
                        )
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
        self.image_family = f"projects/{project}/global/images/family/{image_family(spec.stack)}"
        self.topic = topic
        self.register_outputs(
            {"image_family": self.image_family, "container_image": container, "manifest_sha256": m.sha256}
        )

    @staticmethod
    def _network(name: str, spec: BakeSpec, project: str, kids: pulumi.ResourceOptions) -> gcp.compute.Subnetwork:
        """The bake's own VPC (module docstring): subnet with Private Google Access, Cloud NAT,
        SSH from IAP's range to the Packer VM's tag. Returns the subnetwork."""
        network = gcp.compute.Network(
            child(name, "network"),
            auto_create_subnetworks=False,
            routing_mode="REGIONAL",
            description=f"gpuinfra bake {spec.stack}: the Packer VM's network",
            project=project,
            opts=kids,
        )
        subnet = gcp.compute.Subnetwork(
            child(name, "subnet"),
            network=network.id,
            ip_cidr_range=SYSTEM_CIDR,
            region=spec.region,
            private_ip_google_access=True,
            project=project,
            opts=kids,
        )
        cloud_nat(name, network.id, spec.region, project, kids)  # the cluster's Cloud NAT
        gcp.compute.Firewall(
            child(name, "allow-iap-ssh"),
            network=network.id,
            direction="INGRESS",
            source_ranges=[IAP_SSH_RANGE],
            target_tags=[BUILD_VM_TAG],
            allows=[gcp.compute.FirewallAllowArgs(protocol="tcp", ports=["22"])],
            description="gpuinfra bake: SSH to the Packer VM through Identity-Aware Proxy only",
            project=project,
            opts=kids,
        )
        return subnet

    @staticmethod
    def _grants(
        name: str,
        spec: BakeSpec,
        project: str,
        account: gcp.serviceaccount.Account,
        vm_account: gcp.serviceaccount.Account,
        subnet: gcp.compute.Subnetwork,
        kids: pulumi.ResourceOptions,
    ) -> None:
        """The build service account's grants (module docstring says why each sits where it is)."""
        for role in PROJECT_ROLES:
            gcp.projects.IAMMember(
                child(name, role.split("/")[1].replace(".", "-").lower()),
                project=project,
                role=role,
                member=account.member,
                opts=kids,
            )
        vm_role = gcp.projects.IAMCustomRole(
            child(name, "build-vm-role"),
            role_id=_role_id("gpuinfrabake", spec.stack),
            title=f"gpuinfra bake {spec.stack}: Packer VM"[:100],
            description="create, use and delete the bake's Packer VM and disk, create its images",
            permissions=list(BUILD_VM_PERMISSIONS),
            project=project,
            opts=kids,
        )
        gcp.projects.IAMMember(
            child(name, "build-vm"),
            project=project,
            role=vm_role.name,
            member=account.member,
            condition=gcp.projects.IAMMemberConditionArgs(
                title="gpuinfra-bake-vm-only",
                description="the bake's Packer VM and disk by name, its image family, its base image",
                expression=build_vm_condition(project, spec.zone, spec.stack, spec.manifest.base_image),
            ),
            opts=kids,
        )
        read_role = gcp.projects.IAMCustomRole(
            child(name, "build-read-role"),
            role_id=_role_id("gpuinfrabakeread", spec.stack),
            title=f"gpuinfra bake {spec.stack}: zone and operation reads"[:100],
            description="zones, machine types and operations Packer polls",
            permissions=list(BUILD_READ_PERMISSIONS),
            project=project,
            opts=kids,
        )
        gcp.projects.IAMMember(
            child(name, "build-read"), project=project, role=read_role.name, member=account.member, opts=kids
        )
        gcp.serviceaccount.IAMMember(
            child(name, "vm-sa-user"),
            service_account_id=vm_account.name,
            role="roles/iam.serviceAccountUser",
            member=account.member,
            opts=kids,
        )
        gcp.compute.SubnetworkIAMMember(
            child(name, "subnet-user"),
            project=project,
            region=spec.region,
            subnetwork=subnet.name,
            role="roles/compute.networkUser",
            member=account.member,
            opts=kids,
        )
        gcp.iap.TunnelIamMember(
            child(name, "iap-tunnel"),
            project=project,
            role="roles/iap.tunnelResourceAccessor",
            member=account.member,
            condition=gcp.iap.TunnelIamMemberConditionArgs(
                title="gpuinfra-bake-ssh-only",
                description="IAP TCP forwarding to port 22 only",
                expression="destination.port == 22",
            ),
            opts=kids,
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
