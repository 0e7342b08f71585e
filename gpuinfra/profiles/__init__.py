"""Workload profiles: named bundles of settings that drive the blueprints.

Profiles are data: ``gpuinfra/profiles/data/profiles.yaml`` ships the built-in ones; user
profiles are YAML files (same shape, one mapping of name -> settings per file) in the folder
named by ``--profiles-dir`` or ``$GPUINFRA_PROFILES_DIR``. A user profile with a built-in name
replaces it. Validation is by pydantic; an invalid file is reported with the profile, field
and allowed values.
"""

from __future__ import annotations

import os
import re
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gpuinfra.errors import ProfileError, SpecError
from gpuinfra.fsutil import folder_problem
from gpuinfra.oci import check_image_reference
from gpuinfra.userfile import read_user_file

BUILTIN_PROFILES_FILE = Path(__file__).parent / "data" / "profiles.yaml"
DEFAULT_PROFILE = "llm-finetune"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ScratchSettings(_Strict):
    """Local NVMe scratch: ``required`` fails planning on types without enough; sizes in GiB."""

    required: bool
    min_gib: int = Field(ge=0)


class BucketSettings(_Strict):
    """Object-storage bucket policy: versioning, expiry (days) of objects under the scratch
    prefix, and how long a replaced or deleted object's earlier version is kept
    (``noncurrent_version_days``: S3 lifecycle ``NoncurrentVersionExpiration``, GCS lifecycle
    ``daysSinceNoncurrentTime``; only with versioning on)."""

    versioning: bool
    scratch_prefix: str = Field(min_length=1, pattern=r"^[A-Za-z0-9._/-]+/$")
    scratch_expiry_days: int = Field(ge=1, le=3650)
    noncurrent_version_days: int = Field(default=7, ge=1, le=3650)


class SpotSettings(_Strict):
    """Spot policy (``forbidden``/``allowed``/``preferred``) and checkpoint cadence in minutes."""

    policy: Literal["forbidden", "allowed", "preferred"]
    checkpoint_interval_minutes: int = Field(ge=0)


class ImageSettings(_Strict):
    """Machine images: DLAMI type for the SSM parameter path, DLVM image family on GCP."""

    aws_dlami_type: str = Field(pattern=r"^[a-z0-9][a-z0-9.-]+$")
    gcp_image_family: str = Field(pattern=r"^[a-z0-9][a-z0-9-]+$")


#: The retention periods CloudWatch Logs accepts, in days (PutRetentionPolicy ``retentionInDays``,
#: docs.aws.amazon.com/AmazonCloudWatchLogs/latest/APIReference/API_PutRetentionPolicy.html: "Possible
#: values are: 1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557,
#: 2922, 3288, and 3653"; the same list in botocore's logs service model, shape ``Days``).
CLOUDWATCH_LOG_RETENTION_DAYS = (
    1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653,
)  # fmt: skip


class MonitoringSettings(_Strict):
    """GPU monitoring of the cluster (docs/monitoring.md): the cloud's agent on every node
    (CloudWatch agent / Ops Agent), a dashboard, and an idle alarm / alert policy that fires when
    every GPU of the cluster stays under ``idle_gpu_utilization_percent`` for
    ``idle_alarm_minutes``; with ``job_logs`` the same agent also ships the job's log
    (docs/run.md "Where the logs go").

    Attributes:
        enabled: ``false`` -> no agent, dashboard, alarm, or their charges.
        idle_alarm_minutes: how long every GPU must stay idle before the alarm fires (minutes,
            5-1440; whole minutes: the alarm evaluates 1-minute periods).
        alarm_email: address the alarm notifies (AWS: an SNS email subscription the owner must
            confirm; GCP: an email notification channel); ``null`` -> no notification, the
            alarm / incident still shows in the console.
        job_logs: ``true`` -> the job's log (``gpuinfra run``) also goes to CloudWatch Logs (log
            group ``/gpuinfra/<stack-id>/job``, one stream per instance) / Cloud Logging (the Ops
            Agent receiver ``gpuinfra_job``), besides the stack bucket; needs ``enabled: true`` (the same agent
            ships it). ``false`` (default): the bucket only, nothing billed by the log services.
        job_log_retention_days: days CloudWatch Logs keeps the job log: 1, 3, 5, 7, 14, 30, 60,
            90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288 or 3653 (the
            values PutRetentionPolicy accepts); ``down`` deletes the log group earlier. GCP
            keeps it as long as the project's ``_Default`` log bucket does (30 days unless changed).
    """

    enabled: bool = True
    idle_alarm_minutes: int = Field(default=30, ge=5, le=1440)
    alarm_email: str | None = Field(default=None, pattern=r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
    job_logs: bool = False
    job_log_retention_days: int = 30

    @field_validator("job_log_retention_days")
    @classmethod
    def _retention_cloudwatch_accepts(cls, value: int) -> int:
        """Only the periods PutRetentionPolicy accepts (:data:`CLOUDWATCH_LOG_RETENTION_DAYS`)."""
        if value not in CLOUDWATCH_LOG_RETENTION_DAYS:
            raise ValueError(f"{value} is not a CloudWatch Logs retention; use one of {CLOUDWATCH_LOG_RETENTION_DAYS}")
        return value

    @model_validator(mode="after")
    def _job_logs_need_the_agent(self) -> MonitoringSettings:
        """The job log is shipped by the monitoring agent: ``job_logs`` needs ``enabled``."""
        if self.job_logs and not self.enabled:
            raise ValueError("monitoring.job_logs: true needs monitoring.enabled: true (the agent ships the log)")
        return self


class HangSettings(_Strict):
    """What the node agent does when the job looks hung (docs/lifecycle.md): every GPU at or
    over ``idle_gpu_utilization_percent`` while drawing under ``power_percent`` of its enforced
    power limit, or the progress file the job touches (``GPUINFRA_PROGRESS_FILE``) not touched,
    for ``minutes``. NCCL hangs read 100% utilization at low power (~70 W of an H100's 700 W:
    github.com/NVIDIA/nccl/issues/968; measured on an H100, kernels that only wait drew 18-20% of
    the 700 W limit at 100% utilization, bf16 GEMM 99.7%: benchmarks/results/hang-power-h100-2026-11-26/),
    hence 25% by default (:mod:`gpuinfra.agent.watch`).

    Attributes:
        action: ``alert`` -> one agent log line starting ``GPUINFRA-ALERT job hang:`` and
            ``/run/gpuinfra/hang``; ``end`` -> sync the checkpoints and end the node; ``restart``
            -> the alert, and the job unit stops the job and starts it again from its newest
            checkpoint while the job's ``max_restarts`` allow (else it ends as failed, docs/run.md); ``off``.
        minutes: how long the signs must last (5-1440).
        power_percent: percent of the enforced power limit under which busy GPUs look hung (1-100).
    """

    action: Literal["alert", "end", "restart", "off"] = "alert"
    minutes: int = Field(default=30, ge=5, le=1440)
    power_percent: int = Field(default=25, ge=1, le=100)


#: Profile names: letters, digits, ``.``, ``_`` and ``-`` (a name names files, tags and reaches
#: the boot text as one plain word).
PROFILE_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


class Profile(_Strict):
    """A resolved workload profile.

    Attributes:
        name: profile name (``llm-finetune``).
        description: one line.
        placement: ``required`` -> multi-node clusters only take types that can be placed
            close together (AWS cluster placement group, GCP compact or workload policy);
            ``none`` -> any type. Either way a multi-node cluster is placed close together
            wherever its type allows it.
        high_bandwidth_networking: ``required`` -> multi-node offers must have EFA / GPU NICs
            and the blueprint fails if the type lacks them; ``preferred`` -> used when the type
            has them; ``off`` -> plain networking.
        scratch: local NVMe scratch needs.
        bucket: object-storage policy.
        spot: spot policy and checkpoint cadence.
        idle_timeout_minutes: node agent ends the cluster after this long idle.
        idle_gpu_utilization_percent: a GPU under this utilization counts as idle.
        ttl_hours: hard lifetime of the cluster (``gpuinfra:expires-at`` tag/label).
        root_disk_gib: boot disk size.
        image: machine images.
        container_image: training container pre-pulled on the nodes ("" for none).
        default_run_hours: run length assumed by cost estimates when none is given.
        health_gate: what the nodes do with the boot-time health gate (docs/health-gate.md):
            ``enforce`` -> a node that fails it gets no rank, is left out of the rendezvous and
            is ended; ``report`` -> results are recorded (``gpuinfra check``) and the node still
            trains; ``off`` -> the gate does not run.
        monitoring: GPU utilization metrics, dashboard and idle alarm
            (:class:`MonitoringSettings`; on by default, so stack files written before it
            existed load with monitoring on).
        hang: what the node agent does with a hung job (:class:`HangSettings`; ``alert`` by
            default, so stack files written before it existed load).
    """

    #: Letters, digits, ``.``, ``_`` and ``-`` (it names files, tags and reaches the boot text).
    name: str = Field(pattern=rf"^{PROFILE_NAME_RE.pattern}$")
    description: str
    placement: Literal["required", "none"]
    high_bandwidth_networking: Literal["required", "preferred", "off"]
    scratch: ScratchSettings
    bucket: BucketSettings
    spot: SpotSettings
    idle_timeout_minutes: int = Field(ge=5, le=10080)
    idle_gpu_utilization_percent: int = Field(ge=0, le=100)
    ttl_hours: int = Field(ge=1, le=8760)
    root_disk_gib: int = Field(ge=50, le=16384)
    image: ImageSettings
    container_image: str
    default_run_hours: float = Field(gt=0, le=8760)
    health_gate: Literal["enforce", "report", "off"] = "enforce"
    monitoring: MonitoringSettings = Field(default_factory=MonitoringSettings)
    hang: HangSettings = Field(default_factory=HangSettings)

    @model_validator(mode="after")
    def _versioned_where_spot(self) -> Profile:
        """A spot node can be reclaimed while it uploads: a profile that allows spot keeps
        earlier object versions (``bucket.versioning: true``)."""
        if self.spot.policy != "forbidden" and not self.bucket.versioning:
            raise ValueError(f"spot.policy {self.spot.policy!r} needs bucket.versioning: true")
        return self

    @field_validator("container_image")
    @classmethod
    def _oci_reference(cls, value: str) -> str:
        """The image reaches a unit file and a shell on the node: it must be an OCI reference
        (:func:`gpuinfra.oci.check_image_reference`), or "" for none."""
        try:
            return check_image_reference(value, field="")
        except SpecError as exc:
            raise ValueError(str(exc)) from None


def _read_profiles_file(path: Path) -> dict[str, Profile]:
    doc = read_user_file(path, kind="profiles file", error=ProfileError)
    profiles = {}
    for name, settings in doc.items():
        if not isinstance(name, str):
            raise ProfileError(f"profiles file {path}: profile name {name!r} must be a string")
        if not isinstance(settings, dict):
            raise ProfileError(f"profile {name!r} in {path} must be a mapping of settings")
        odd = [key for key in settings if not isinstance(key, str) or key == "name"]
        if odd:
            raise ProfileError(
                f"profile {name!r} in {path}: {odd[0]!r} is not a setting (a profile's name is its key in the "
                f"file; settings are: {', '.join(sorted(f for f in Profile.model_fields if f != 'name'))})"
            )
        try:
            profiles[str(name)] = Profile(name=str(name), **settings)
        except ValidationError as exc:
            problems = [f"field {'.'.join(str(p) for p in err['loc'])!r}: {err['msg']}" for err in exc.errors()]
            more = f" (+{len(problems) - 3} more)" if len(problems) > 3 else ""
            raise ProfileError(f"profile {name!r} in {path}: {'; '.join(problems[:3])}{more}") from None
    return profiles


def profiles_dir(explicit: Path | None = None) -> Path | None:
    """The user profiles folder: ``explicit``, else ``$GPUINFRA_PROFILES_DIR``, else None."""
    if explicit is not None:
        return Path(explicit)
    env = os.environ.get("GPUINFRA_PROFILES_DIR")
    return Path(env) if env else None


def check_profiles_folder(user_dir: Path | None) -> Path | None:
    """Return ``user_dir`` (``--profiles-dir``) if it, or else ``$GPUINFRA_PROFILES_DIR``, is a
    folder gpuinfra can read profiles from (or neither is set); else raise.

    Raises:
        ProfileError: the folder is missing or not a folder (the message names where it came from).
    """
    folder = profiles_dir(user_dir)
    problem = folder_problem(folder) if folder is not None else None
    if problem:
        source = "--profiles-dir" if user_dir is not None else "$GPUINFRA_PROFILES_DIR"
        raise ProfileError(f"profiles folder {folder} ({source}) {problem}; give a folder of profile YAML files")
    return user_dir


@lru_cache(maxsize=1)
def _builtin() -> dict[str, Profile]:
    return _read_profiles_file(BUILTIN_PROFILES_FILE)


def _load_all(user_dir: Path | None) -> dict[str, Profile]:
    profiles = dict(_builtin())
    if user_dir is not None:
        if not user_dir.is_dir():
            raise ProfileError(f"profiles folder {user_dir} does not exist")
        for path in sorted(user_dir.glob("*.y*ml")):
            profiles.update(_read_profiles_file(path))
    return profiles


def load_profiles(user_dir: Path | None = None) -> dict[str, Profile]:
    """All profiles by name: built-in ones, overridden/extended by the user folder.

    Raises:
        ProfileError: a file is unreadable or a profile invalid.
    """
    return _load_all(profiles_dir(user_dir))


def get_profile(name: str, user_dir: Path | None = None) -> Profile:
    """One profile by name.

    Raises:
        ProfileError: unknown name (the message lists the known ones).
    """
    profiles = load_profiles(user_dir)
    if name not in profiles:
        raise ProfileError(f"unknown profile {name!r}; known profiles: {', '.join(sorted(profiles))}")
    return profiles[name]
