"""Offline preview: run the real Pulumi program in-process under Pulumi's mocks.

No Pulumi CLI, no plugins, no credentials: :func:`run_preview` sets
``pulumi.runtime.set_mocks`` with a monitor that records every resource registration (type
token, name, parent, inputs exactly as the SDK serializes them, camelCase), runs
``blueprints.program.build`` for the stack's spec, and returns the records. This is what
``gpuinfra preview`` prints and what the cost preview prices. It is a model of
``pulumi preview``, not the engine itself: values the clouds compute at deploy time (AMI ids
from SSM, instance ids, private IPs) are placeholders, listed in :attr:`PreviewResult.notes`.

Each run happens in a fresh :mod:`contextvars` context so runs do not share Pulumi's root
stack or config.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import blueprints
from gpuinfra import __version__
from gpuinfra.catalog.store import PACKAGE_DATA_DIR, catalog_dir
from gpuinfra.fsutil import atomic_write_text
from gpuinfra.rules.model import ResourceGraph, Violation
from gpuinfra.spec import ClusterSpec
from gpuinfra.templating import templates_dir

#: Deep Learning AMI types whose SSM parameters exist
#: (/aws/service/deeplearning/ami/x86_64/<type>/latest/ami-id), from
#: docs.aws.amazon.com/dlami/latest/devguide/find-dlami-id.html and public code cited in
#: docs/sources/cluster-facts.md section 3.7. The offline preview resolves only these; a deploy asks SSM.
KNOWN_DLAMI_TYPES = frozenset(
    {
        "base-oss-nvidia-driver-gpu-ubuntu-22.04",
        "base-oss-nvidia-driver-gpu-ubuntu-24.04",
        "base-oss-nvidia-driver-gpu-amazon-linux-2023",
        "oss-nvidia-driver-gpu-pytorch-2.7-ubuntu-22.04",
    }
)
_DLAMI_PARAM = re.compile(r"^/aws/service/deeplearning/ami/(x86_64|arm64)/(?P<type>[a-z0-9.-]+)/latest/ami-id$")
PREVIEW_AMI_ID = "ami-0000000000preview"
PREVIEW_ACCOUNT = "123456789012"
#: The project number the offline preview answers for ``getProject`` (the real one is known at deploy).
PREVIEW_PROJECT_NUMBER = "000000000000"


class CallFailure(Exception):
    """A provider function call that the cloud would answer with an error (e.g. SSM
    ParameterNotFound). Reported to the program as an invoke failure it can catch."""

    def __init__(self, prop: str, reason: str):
        super().__init__(reason)
        self.prop = prop
        self.reason = reason


@dataclass
class ResourceRecord:
    """One registered resource: Pulumi type token, logical name, parent name, inputs."""

    type: str
    name: str
    parent: str | None
    custom: bool
    inputs: dict[str, Any]
    retain_on_delete: bool = False
    replace_on_changes: tuple[str, ...] = ()
    delete_before_replace: bool = False
    ignore_changes: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """``{"type", "name", "parent", "inputs", "retainOnDelete", "replaceOnChanges",
        "deleteBeforeReplace", "ignoreChanges"}`` as in the preview JSON."""
        return {
            "type": self.type,
            "name": self.name,
            "parent": self.parent,
            "inputs": self.inputs,
            "retainOnDelete": self.retain_on_delete,
            "replaceOnChanges": list(self.replace_on_changes),
            "deleteBeforeReplace": self.delete_before_replace,
            "ignoreChanges": list(self.ignore_changes),
        }


@dataclass
class PreviewResult:
    """Outcome of one offline preview."""

    stack: str
    resources: list[ResourceRecord]
    outputs: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    #: The ``provider-valid-values`` verdict on these resources, when the cache had it
    #: (:func:`run_preview_cached`); None: not computed, the rules compute it (importing the SDKs).
    provider_violations: list[Violation] | None = None

    def of_type(self, token: str) -> list[ResourceRecord]:
        """Resources whose type token is ``token`` (e.g. ``aws:ec2/subnet:Subnet``)."""
        return [r for r in self.resources if r.type == token]

    def to_json(self) -> dict[str, Any]:
        """The documented preview JSON: ``{"stack", "resources": [...], "outputs", "notes"}``."""
        return {
            "stack": self.stack,
            "resources": [r.to_json() for r in self.resources],
            "outputs": self.outputs,
            "notes": self.notes,
        }


class PreviewTarget(Protocol):
    """What the mocks read from any program's spec, a cluster's or a bake's
    (:class:`gpuinfra.bake.model.BakeSpec`, which sits above this module and is not imported)."""

    @property
    def region(self) -> str:
        """The cloud region the program deploys to."""
        ...

    @property
    def stack(self) -> str:
        """The stack name."""
        ...


class PreviewMocks:
    """Answers provider calls and fills computed outputs the way the clouds would, offline.

    Subclass and override :meth:`call_result` in tests to simulate other cloud answers (an
    existing subnet in another AZ, an SSM parameter that does not exist ...).
    """

    def __init__(self, spec: ClusterSpec | PreviewTarget):
        self.spec = spec
        self.notes: list[str] = []

    def call_result(self, token: str, args: dict) -> dict:
        """Result of a provider function (data source) call.

        Raises:
            CallFailure: for calls the clouds would reject (unknown SSM parameter).
            Exception: for calls the offline preview cannot model (a bug to fix here).
        """
        spec = self.spec
        if token == "aws:ssm/getParameter:getParameter":
            match = _DLAMI_PARAM.match(args.get("name", ""))
            if not match or match.group("type") not in KNOWN_DLAMI_TYPES:
                raise CallFailure(
                    "name",
                    f"ParameterNotFound: {args.get('name')} (offline preview knows "
                    f"the DLAMI types {', '.join(sorted(KNOWN_DLAMI_TYPES))})",
                )
            self._note(f"AMI: {PREVIEW_AMI_ID} stands for the value of SSM {args['name']} at deploy time")
            return {
                "name": args["name"],
                "value": PREVIEW_AMI_ID,
                "insecureValue": PREVIEW_AMI_ID,
                "type": "String",
                "version": 1,
                "arn": f"arn:aws:ssm:{spec.region}::parameter{args['name']}",
                "id": args["name"],
                "withDecryption": True,
            }
        if token == "aws:ec2/getAmi:getAmi":
            ami = (args.get("filters") or [{}])[0].get("values", [""])[0]
            root = (
                "/dev/xvda"
                if isinstance(spec, ClusterSpec)
                and "amazon-linux" in spec.profile.image.aws_dlami_type
                and not spec.ami_id
                else "/dev/sda1"  # a bake's base: the profiles' Ubuntu DLAMI
            )
            self._note(f"root device {root} of {ami} is assumed offline (DLAMI family); a deploy reads it from EC2")
            return {
                "id": ami,
                "imageId": ami,
                "rootDeviceName": root,
                "rootDeviceType": "ebs",
                "architecture": "x86_64",
                "blockDeviceMappings": [],
                "name": "preview",
                "ownerId": PREVIEW_ACCOUNT,
            }
        if token == "aws:ec2/getSubnet:getSubnet" and isinstance(spec, ClusterSpec):  # cluster programs only
            self._note(f"existing subnet {args.get('id')}: AZ not verifiable offline, assumed {spec.zone}")
            return {
                "id": args.get("id"),
                "availabilityZoneId": spec.zone,
                "vpcId": spec.network.vpc_id or "",
                "cidrBlock": "",
                "tags": {},
            }
        if token == "aws:index/getAvailabilityZone:getAvailabilityZone":
            self._note(f"AZ name of {args.get('zoneId')} is account-specific: resolved at deploy time")
            return {
                "zoneId": args.get("zoneId"),
                "name": f"<name of {args.get('zoneId')}>",
                "region": spec.region,
                "state": "available",
                "id": args.get("zoneId"),
                "zoneType": "availability-zone",
                "groupName": spec.region,
                "networkBorderGroup": spec.region,
                "nameSuffix": "",
                "optInStatus": "",
            }
        if token == "aws:index/getCallerIdentity:getCallerIdentity":
            self._note(f"AWS account id is resolved at deploy time (preview uses {PREVIEW_ACCOUNT})")
            return {
                "accountId": PREVIEW_ACCOUNT,
                "arn": f"arn:aws:iam::{PREVIEW_ACCOUNT}:user/preview",
                "userId": "PREVIEW",
                "id": PREVIEW_ACCOUNT,
            }
        if token == "aws:ec2/getInstances:getInstances":
            self._note("instance ids and private IPs are known only after deploy")
            return {"ids": [], "privateIps": [], "publicIps": [], "ipv6Addresses": [], "id": "preview"}
        if token == "gcp:organizations/getProject:getProject":
            self._note(f"project number: {PREVIEW_PROJECT_NUMBER} stands for the project's number at deploy time")
            project = args.get("projectId", "")
            return {
                "projectId": project,
                "number": PREVIEW_PROJECT_NUMBER,
                "name": project,
                "id": f"projects/{project}",
            }
        raise Exception(f"offline preview cannot answer provider call {token}")

    def new_resource_state(self, typ: str, name: str, inputs: dict) -> tuple[str, dict]:
        """(id, state) of a newly registered resource: inputs plus typical computed outputs."""
        state = dict(inputs)
        rid = f"{name}-id"
        if typ == "aws:s3/bucket:Bucket":
            bucket = f"{inputs.get('bucketPrefix', name + '-')}0000preview"
            rid = bucket
            state.update(bucket=bucket, arn=f"arn:aws:s3:::{bucket}")
        elif typ.startswith("aws:iam/"):
            state.setdefault("name", name)
            state["arn"] = f"arn:aws:iam::{PREVIEW_ACCOUNT}:{typ.split(':')[-1].lower()}/{name}"
        elif typ == "aws:ecr/repository:Repository":  # repository_url: <account>.dkr.ecr.<region>.amazonaws.com/<name>
            repo = inputs.get("name", name)
            state.update(
                arn=f"arn:aws:ecr:{self.spec.region}:{PREVIEW_ACCOUNT}:repository/{repo}",
                repositoryUrl=f"{PREVIEW_ACCOUNT}.dkr.ecr.{self.spec.region}.amazonaws.com/{repo}",
            )
        elif typ == "aws:ec2/launchTemplate:LaunchTemplate":
            state.update(
                latestVersion=1,
                defaultVersion=1,
                arn=f"arn:aws:ec2:{self.spec.region}:{PREVIEW_ACCOUNT}:launch-template/{rid}",
            )
        elif typ == "aws:lambda/function:Function":
            state.setdefault("name", name)
            state["arn"] = f"arn:aws:lambda:{self.spec.region}:{PREVIEW_ACCOUNT}:function:{state['name']}"
        elif typ == "aws:cloudwatch/eventRule:EventRule":
            state.setdefault("name", name)
            state["arn"] = f"arn:aws:events:{self.spec.region}:{PREVIEW_ACCOUNT}:rule/{state['name']}"
        elif typ == "aws:ec2/subnet:Subnet" and not inputs.get("availabilityZoneId"):
            # a subnet created without a zone (the AWS bake's build subnet): EC2 picks one at deploy
            self._note(f"subnet {name}: EC2 picks its Availability Zone at deploy time")
            state["availabilityZoneId"] = f"<zone EC2 picks for {name}>"
        elif typ == "aws:ec2/placementGroup:PlacementGroup":
            state.setdefault("name", name)
        elif typ == "aws:ec2/fleet:Fleet":
            self._note("instance ids are known only after deploy (the preview assumes the fleet launched every node)")
            rid = f"fleet-{name}-preview"
            state["arn"] = f"arn:aws:ec2:{self.spec.region}:{PREVIEW_ACCOUNT}:fleet/{rid}"
            capacity = inputs.get("targetCapacitySpecification") or {}
            nodes = int(capacity.get("totalTargetCapacity") or 0)
            state.setdefault(
                "fleetInstanceSets",
                [
                    {
                        "instanceIds": [f"i-preview{n:04d}" for n in range(nodes)],
                        "lifecycle": capacity.get("defaultTargetCapacityType", "on-demand"),
                    }
                ],
            )
        if typ.startswith("gcp:"):
            project = inputs.get("project", "gpuinfra-preview")
            kind = typ.split(":")[-1][0].lower() + typ.split(":")[-1][1:]
            kind = kind[:-1] + "ies" if kind.endswith("y") else kind + "s"
            resource_name = (
                inputs.get("name") or (inputs.get("namePrefix", name) + "preview")
                if typ.endswith(":InstanceTemplate")
                else inputs.get("name", name)
            )
            state["name"] = resource_name
            link = f"https://www.googleapis.com/compute/v1/projects/{project}/{kind}/{resource_name}"
            state.update(selfLink=link, selfLinkUnique=f"{link}?uniqueId=1")
            if typ == "gcp:serviceaccount/account:Account":
                state["email"] = f"{inputs.get('accountId')}@{project}.iam.gserviceaccount.com"
                state["member"] = f"serviceAccount:{state['email']}"
            if typ == "gcp:storage/bucket:Bucket":
                rid = state["name"] = f"{name}-0000preview"
                state["url"] = f"gs://{rid}"
            if typ == "gcp:compute/instanceGroupManager:InstanceGroupManager":
                self._note("GCP VM names and internal IPs are known only after deploy")
                state["instanceGroup"] = f"{link.replace('instanceGroupManagers', 'instanceGroups')}"
            return rid, state
        state.setdefault("arn", f"arn:preview:{typ}:{name}")
        return rid, state

    def _note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)


def _make_runtime_mocks(preview_mocks: PreviewMocks):
    import pulumi

    class _Mocks(pulumi.runtime.Mocks):
        def new_resource(self, args: pulumi.runtime.MockResourceArgs):
            return preview_mocks.new_resource_state(args.typ, args.name, args.inputs)

        def call(self, args: pulumi.runtime.MockCallArgs):
            try:
                return preview_mocks.call_result(args.token, args.args)
            except CallFailure as failure:
                return {}, [(failure.prop, failure.reason)]

    return _Mocks()


def _make_monitor(mocks, records: list[ResourceRecord], outputs: dict):
    from pulumi.runtime import rpc
    from pulumi.runtime.mocks import MockMonitor

    class _RecordingMonitor(MockMonitor):
        def RegisterResource(self, request):  # noqa: N802 (gRPC method name)
            response = super().RegisterResource(request)
            if request.type != "pulumi:pulumi:Stack":
                parent = request.parent.split("::")[-1] if request.parent else None
                if request.parent and request.parent.split("::")[2].endswith("pulumi:pulumi:Stack"):
                    parent = None
                records.append(
                    ResourceRecord(
                        type=request.type,
                        name=request.name,
                        parent=parent,
                        custom=bool(request.custom),
                        inputs=_plain(rpc.deserialize_properties(request.object)),
                        retain_on_delete=bool(getattr(request, "retainOnDelete", False)),
                        replace_on_changes=tuple(getattr(request, "replaceOnChanges", ()) or ()),
                        delete_before_replace=bool(getattr(request, "deleteBeforeReplace", False)),
                        ignore_changes=tuple(getattr(request, "ignoreChanges", ()) or ()),
                    )
                )
            return response

        def RegisterResourceOutputs(self, request):  # noqa: N802
            if "gpuinfra:" in request.urn.split("::")[2]:
                outputs.update(_plain(rpc.deserialize_properties(request.outputs)))
            return super().RegisterResourceOutputs(request)

    return _RecordingMonitor(mocks)


def _plain(value: Any) -> Any:
    """Deserialized properties as plain JSON-able values (sorted dict keys for stable output)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in sorted(value.items()) if not str(k).startswith("__")}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)  # the wire format carries every number as a double
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


def run_program(stack: str, mocks: PreviewMocks, config: dict[str, str], program: Callable[[], Any]) -> PreviewResult:
    """Run ``program`` (a Pulumi program function) offline under ``mocks`` with ``config`` as
    the stack's configuration, in a fresh context and event loop, and return every resource it
    registers. The cluster preview (:func:`run_preview`) and the bake preview
    (:func:`gpuinfra.bake.preview.run_bake_preview`) both run through here.

    Args:
        stack: the stack name.
        mocks: answers for provider calls; its notes become the result's notes.
        config: stack configuration, key -> string value (``gpuinfra:cluster`` JSON, provider settings).
        program: builds the resources (e.g. ``lambda: blueprints.program.build(spec)``).
    """
    return contextvars.Context().run(_run, stack, mocks, config, program)


def _run(stack: str, mocks: PreviewMocks, config: dict[str, str], program: Callable[[], Any]) -> PreviewResult:
    import pulumi
    from pulumi.runtime.settings import SETTINGS
    from pulumi.runtime.stack import run_pulumi_func
    from pulumi.runtime.sync_await import _sync_await

    loop = asyncio.new_event_loop()  # one loop per run, closed after it: no loop leaks between runs
    asyncio.set_event_loop(loop)
    records: list[ResourceRecord] = []
    outputs: dict[str, Any] = {}
    runtime_mocks = _make_runtime_mocks(mocks)
    monitor = _make_monitor(runtime_mocks, records, outputs)
    pulumi.runtime.set_mocks(runtime_mocks, project="gpuinfra", stack=stack, preview=True, monitor=monitor)
    pulumi.runtime.set_all_config(config)
    SETTINGS.rpc_manager.clear()
    SETTINGS.outputs.clear()
    try:
        _sync_await(run_pulumi_func(program))
    finally:
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()
        asyncio.set_event_loop(None)
    return PreviewResult(stack=stack, resources=records, outputs=outputs, notes=list(mocks.notes))


def run_preview(
    spec: ClusterSpec, provider_config: dict[str, str] | None = None, mocks: PreviewMocks | None = None
) -> PreviewResult:
    """Run the stack's program offline and return every resource it registers.

    Args:
        spec: the cluster spec (from the stack file).
        provider_config: provider settings such as ``{"aws:region": "us-east-1"}``.
        mocks: answers for provider calls (default :class:`PreviewMocks`).

    Raises:
        gpuinfra.errors.SpecError: the blueprint rejected the spec (before any resource).
    """

    def program():
        # imported when the program runs: blueprints load Pulumi and the cloud provider SDKs
        from blueprints.program import build

        return build(spec)

    config = {"gpuinfra:cluster": json.dumps(spec.to_config()), **(provider_config or {})}
    return run_program(spec.stack, mocks or PreviewMocks(spec), config, program)


def _record_from_json(data: dict) -> ResourceRecord:
    return ResourceRecord(
        type=data["type"],
        name=data["name"],
        parent=data["parent"],
        custom=True,
        inputs=data["inputs"],
        retain_on_delete=data.get("retainOnDelete", False),
        replace_on_changes=tuple(data.get("replaceOnChanges", ())),
        delete_before_replace=data.get("deleteBeforeReplace", False),
        ignore_changes=tuple(data.get("ignoreChanges", ())),
    )


def preview_fingerprint(spec: ClusterSpec, provider_config: dict[str, str]) -> str:
    """SHA-256 of everything the offline preview depends on: the spec and provider config, the
    program (blueprints/ and the plan it builds from, gpuinfra/plan/; templates, node agent,
    preview engine), the catalog files, and the installed Pulumi SDK versions."""
    import hashlib
    from importlib import metadata
    from pathlib import Path

    digest = hashlib.sha256()
    digest.update(json.dumps([spec.to_config(), provider_config, __version__], sort_keys=True, default=str).encode())
    for package in ("pulumi", "pulumi-aws", "pulumi-gcp"):
        digest.update(f"{package}={metadata.version(package)}".encode())
    here = Path(__file__).parent
    files = (
        sorted(Path(blueprints.__file__).parent.rglob("*.py"))
        + sorted((here / "plan").rglob("*.py"))
        + sorted(templates_dir().glob("*.j2"))
        + [
            Path(__file__),
            here / "rules" / "provider_values.py",  # the cached provider-valid-values verdict
            here / "agent" / "node.py",
            here / "templating.py",
            here / "spec.py",
            catalog_dir() / "offers.csv",
            catalog_dir() / "instance_types.json",
            PACKAGE_DATA_DIR / "gcp_machine_facts.json",
        ]
    )
    for path in files:
        digest.update(str(path.name).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def cache_dir():
    """``$XDG_CACHE_HOME/gpuinfra/preview`` (default ``~/.cache/gpuinfra/preview``)."""
    import os
    from pathlib import Path

    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gpuinfra" / "preview"


def run_preview_cached(spec: ClusterSpec, provider_config: dict[str, str] | None = None) -> PreviewResult:
    """:func:`run_preview`, remembered on disk by :func:`preview_fingerprint`.

    The program is deterministic for a given fingerprint, so a cached result is the result; the
    cache saves the Pulumi SDK imports (~2 s) on repeated ``preview`` / ``cost`` runs. The entry
    also holds the ``provider-valid-values`` verdict
    (:func:`gpuinfra.rules.provider_values.check_provider_values`, which reads the installed
    SDKs' docstrings): it depends only on the resources and the SDK versions, both in the
    fingerprint, so a cache hit imports no provider SDK at all
    (:attr:`PreviewResult.provider_violations`). ``GPUINFRA_NO_CACHE=1`` turns the cache off.
    """
    import os

    config = provider_config or {}
    if os.environ.get("GPUINFRA_NO_CACHE") == "1":
        return run_preview(spec, config)
    path = cache_dir() / f"{preview_fingerprint(spec, config)}.json"
    if path.is_file():
        try:
            doc = json.loads(path.read_text())
            return PreviewResult(
                stack=doc["stack"],
                resources=[_record_from_json(r) for r in doc["resources"]],
                outputs=doc["outputs"],
                notes=doc["notes"],
                provider_violations=[Violation(**v) for v in doc["provider_violations"]],
            )
        except (ValueError, KeyError, TypeError):
            pass  # unreadable entry: recompute and overwrite
    result = run_preview(spec, config)
    # imported on use: it imports the provider SDKs' docstrings, which only a fresh preview pays
    from gpuinfra.rules.provider_values import check_provider_values

    result.provider_violations = check_provider_values(ResourceGraph.from_records(result.resources))
    entry = {**result.to_json(), "provider_violations": [vars(v) for v in result.provider_violations]}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(entry))
    except OSError:
        pass  # a read-only cache folder only costs speed
    return result
