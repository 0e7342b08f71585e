"""``GcpGpuCluster``: the GCP GPU training cluster as one Pulumi ComponentResource."""

from __future__ import annotations

import pulumi

from blueprints.gcp.monitoring import build_monitoring
from blueprints.gcp.network import build_networks
from blueprints.gcp.nodes import (
    build_bulk_instances,
    build_group,
    build_placement_policy,
    build_template,
    build_workload_policy,
)
from blueprints.gcp.resize_request import build_resize_request
from blueprints.gcp.storage import (
    build_bucket,
    build_bundle_object,
    build_monitoring_role,
    build_node_role,
    build_secret_reader,
    build_service_account,
)
from gpuinfra.money import usd_json
from gpuinfra.plan.boot_gcp import node_prefix
from gpuinfra.plan.cluster import plan_cluster
from gpuinfra.plan.formation import CAPACITY_TIMEOUT_CONFIG_KEY, DEFAULT_CAPACITY_TIMEOUT_SECONDS
from gpuinfra.spec import ClusterSpec

TYPE_TOKEN = "gpuinfra:gcp:GpuCluster"
PREVIEW_PROJECT = "gpuinfra-preview"


def project_id(spec: ClusterSpec) -> str:
    """``spec.gcp_project``, else the stack's ``gcp:project`` config."""
    return spec.gcp_project or pulumi.Config("gcp").get("project") or PREVIEW_PROJECT


class GcpGpuCluster(pulumi.ComponentResource):
    """GPU VMs in one zone with compact placement, gVNIC / GPUDirect NICs, local SSD scratch,
    a GCS bucket and a Deep Learning VM image.

    Args:
        name: component name (the stack name); children are named ``<name>-<role>``.
        spec: the validated cluster spec (``cloud == "gcp"``).
        opts: Pulumi resource options.

    Raises:
        SpecError: see :func:`gpuinfra.plan.cluster.plan_cluster` -- before any resource.
    """

    def __init__(self, name: str, spec: ClusterSpec, opts: pulumi.ResourceOptions | None = None) -> None:
        cluster_plan = plan_cluster(spec)
        plan = cluster_plan.gcp
        assert plan is not None  # plan_cluster of a GCP spec always carries the GCP plan
        super().__init__(TYPE_TOKEN, name, None, opts)
        project = project_id(spec)
        self.cluster_plan = cluster_plan
        self.plan = plan
        networks = build_networks(name, spec, plan, project, self)
        self.bucket = build_bucket(name, spec, project, self)
        account = build_service_account(name, spec, self.bucket, project, self)
        build_secret_reader(name, spec, account, project, self)
        policy = build_placement_policy(name, spec, plan, project, self)
        self.node_bundle = build_bundle_object(name, self.bucket, cluster_plan.node_bundle, self)
        template = build_template(
            name,
            spec,
            plan,
            networks,
            account,
            self.bucket,
            policy,
            project,
            self,
            depends_on=[self.node_bundle],
            bundle=cluster_plan.node_bundle,
        )
        workload = build_workload_policy(name, spec, plan, project, self)
        self.group = build_group(name, spec, plan, template, workload, project, self)
        timeout = pulumi.Config("gpuinfra").get_int(CAPACITY_TIMEOUT_CONFIG_KEY) or DEFAULT_CAPACITY_TIMEOUT_SECONDS
        self.bulk = build_bulk_instances(name, spec, plan, template, project, timeout, self, depends_on=[self.group])
        self.resize_request = build_resize_request(name, spec, plan, self.group, project, self)  # flex-start only
        prefix = node_prefix(spec)
        build_node_role(name, spec, account, project, prefix, self)
        self.outputs = {
            "bucket_name": self.bucket.name,
            "bucket_url": self.bucket.name.apply(lambda b: f"gs://{b}"),
            "instance_group": self.group.instance_group,
            # the MIG's members and the bulk-inserted nodes: every VM named <group>-...
            "list_nodes_command": f"gcloud compute instances list --zones {spec.zone} --filter='name~^{prefix}-'",
            "ssh_command": (
                f"gcloud compute ssh <instance> --zone {spec.zone} --tunnel-through-iap"
                if spec.network.iap_ssh
                else "no SSH path: set network.iap_ssh: true in the stack file (IAP + OS Login)"
            ),
            "nccl_env": cluster_plan.outputs.nccl_env,
            "run_command": cluster_plan.outputs.run_command,
            "torchrun_rendezvous_endpoint": (
                f"<lowest node IP, /etc/gpuinfra/cluster.env>:{cluster_plan.outputs.torchrun_port}"
            ),
            "price_per_hour_usd": usd_json(spec.price_per_hour_usd),
            "nics_per_node": cluster_plan.network.nics_per_node,
            "local_ssd_per_node": cluster_plan.storage.scratch_disks,
        }
        if self.bulk is not None:  # the bulk-inserted nodes (`down` / `status` find them by these names)
            self.outputs["bulk_instance_names"] = self.bulk.names
        # GPU monitoring: metric writer role, dashboard, idle alert; outputs feed `gpuinfra status`
        build_monitoring_role(name, spec, account, project, self)
        self.monitoring = build_monitoring(name, spec, project, self)
        if self.monitoring is not None:
            self.outputs.update(self.monitoring.outputs)
        self.register_outputs(self.outputs)

    def exports(self) -> dict:
        """Stack outputs (``pulumi stack output``)."""
        return self.outputs
