"""``gpuinfra preview``: the stack's resources, offline, from the real program under Pulumi mocks."""

from __future__ import annotations

from pathlib import Path

import typer

from gpuinfra.cli import options

#: Inputs shown per resource type in the tree view (the JSON has all of them).
KEY_INPUTS = {
    "aws:ec2/vpc:Vpc": ["cidrBlock"],
    "aws:ec2/subnet:Subnet": ["availabilityZoneId", "cidrBlock", "mapPublicIpOnLaunch"],
    "aws:ec2/securityGroupRule:SecurityGroupRule": ["type", "protocol", "fromPort", "toPort", "self", "cidrBlocks"],
    "aws:ec2/placementGroup:PlacementGroup": ["strategy"],
    "aws:ec2/vpcEndpoint:VpcEndpoint": ["serviceName", "vpcEndpointType"],
    "aws:ec2/fleet:Fleet": ["type", "targetCapacitySpecification"],
    "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock": [
        "blockPublicAcls",
        "blockPublicPolicy",
        "ignorePublicAcls",
        "restrictPublicBuckets",
    ],
    "aws:s3/bucket:Bucket": ["bucketPrefix", "forceDestroy"],
    "aws:iam/rolePolicyAttachment:RolePolicyAttachment": ["policyArn"],
    "aws:scheduler/schedule:Schedule": ["scheduleExpression", "scheduleExpressionTimezone"],
}


def _launch_template_summary(inputs: dict) -> str:
    nics = inputs.get("networkInterfaces", [])
    kinds: dict[str, int] = {}
    for nic in nics:
        kinds[nic.get("interfaceType", "interface")] = kinds.get(nic.get("interfaceType", "interface"), 0) + 1
    cards = sorted(n.get("networkCardIndex", 0) for n in nics)
    root = (inputs.get("blockDeviceMappings") or [{}])[0].get("ebs", {})
    return (
        f"instanceType={inputs.get('instanceType')} imageId={inputs.get('imageId')} "
        f"NICs={len(nics)} ({', '.join(f'{v} {k}' for k, v in kinds.items())}; cards {cards[0]}..{cards[-1]}) "
        f"IMDS httpTokens={inputs.get('metadataOptions', {}).get('httpTokens')} "
        f"root={root.get('volumeSize')} GiB {root.get('volumeType')} encrypted={root.get('encrypted')} "
        f"shutdown={inputs.get('instanceInitiatedShutdownBehavior')}"
    )


def _fleet_summary(inputs: dict) -> str:
    keys = KEY_INPUTS["aws:ec2/fleet:Fleet"]
    text = " ".join(f"{k}={inputs[k]}" for k in keys if k in inputs)
    overrides = (inputs.get("launchTemplateConfigs") or [{}])[0].get("overrides") or [{}]
    if "maxPrice" in overrides[0]:  # the spot max price (EC2 Fleet MaxPrice per instance-hour)
        text += f" spot maxPrice={overrides[0]['maxPrice']}/instance-h"
        text += f" maxTotalPrice={(inputs.get('spotOptions') or {}).get('maxTotalPrice')}/h"
    return text


def _summary(record) -> str:
    if record.type == "aws:ec2/launchTemplate:LaunchTemplate":
        return _launch_template_summary(record.inputs)
    if record.type == "aws:ec2/fleet:Fleet":
        return _fleet_summary(record.inputs)
    keys = KEY_INPUTS.get(record.type, [])
    return " ".join(f"{k}={record.inputs[k]}" for k in keys if k in record.inputs)


def preview(
    stack: str = typer.Argument(..., help="Stack name (stacks/Pulumi.<stack>.yaml)."),
    project_dir: Path = options.ProjectDir,
    as_json: bool = options.Json,
) -> None:
    """Show every resource the stack would create, offline (no Pulumi CLI, no credentials)."""
    # imported on use: CLI start-up time (only the command that runs loads its library modules)
    from gpuinfra.cli.console import print_json, stdout_console
    from gpuinfra.verify import verify_stack_file

    verified = verify_stack_file(project_dir, stack)
    if as_json:
        print_json(verified.to_json())
        return
    from rich.tree import Tree

    # imported on use: CLI start-up time (only the command that runs loads its library modules)
    from gpuinfra.cost.report import document_total, unpriced_lines
    from gpuinfra.rules import RULES

    spec, result, summary = verified.spec, verified.preview, verified.cost
    out = stdout_console()
    roots = [r for r in result.resources if r.parent is None]
    tree = Tree(
        f"[bold]{stack}[/bold]: {len(result.resources)} resources (offline preview of {spec.nodes} x {spec.instance_type})"
    )
    for root in roots:
        branch = tree.add(f"{root.type} [bold]{root.name}[/bold]")
        for child in (r for r in result.resources if r.parent == root.name):
            key_inputs = _summary(child)
            branch.add(f"{child.type} {child.name}" + (f"  [dim]{key_inputs}[/dim]" if key_inputs else ""))
    out.print(tree)
    for note in result.notes:
        out.print(f"note: {note}")
    hourly, run = document_total(summary, "hourly_usd"), document_total(summary, "run_usd")
    totals = f"{hourly.text(suffix='/h')}, {run.text()}" if hourly.complete else hourly.text()
    out.print(
        f"cost: {totals} for {summary['hours']} h "
        f"({summary['pricing']}, catalog {summary['catalog_date']}); breakdown: gpuinfra cost {stack}"
    )
    missing = unpriced_lines(summary)
    if missing:
        out.print(f"warning: no price for {'; '.join(missing)}; `gpuinfra cost {stack}` exits 4", markup=False)
    out.print(
        f"conformance: {len(RULES)} rules checked offline, no violation "
        "(capacity and quotas are known only to the cloud)"
    )
    out.print(f"next: gpuinfra up {stack}")
