"""`gpujobs doctor`: check a deployed stack's account against docs/deploy.md's account checklist.

Each check reads what the account says (the stack's parameters and outputs, Lambda's account
settings, Service Quotas, the EBS default key, the subnets' routes and the VPC's endpoints, the spot
service-linked role, the alarm topic's subscriptions) and answers ok, warn (works, but something
will bite), fail (a job will fail) or unknown (the call was refused or is not available: the
answer names the call). A check never raises: one unreadable answer never hides the others.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from gpujobs.domain.quotas import QUOTAS as EC2_QUOTAS
from gpujobs.domain.quotas import family as _family

OK, WARN, FAIL, UNKNOWN = "ok", "warn", "fail", "unknown"
REQUIRED_ENDPOINTS = (
    "s3",
    "lambda",
    "events",
    "ec2",
    "logs",
    "secretsmanager",
    "ssm",
    "ecr.api",
    "ecr.dkr",
    "ssmmessages",
    "ec2messages",
    "monitoring",
)
"""The VPC endpoints a subnet without NAT needs (`com.amazonaws.<region>.` + these; docs/deploy.md)."""
QUOTAS = {(family, market.value): (quota.code, quota.name) for (family, market), quota in EC2_QUOTAS.items()}
"""EC2 vCPU quotas (service code ec2) by instance family and market: the launcher's own table
(`gpujobs.domain.quotas`), which names the same quota in a job a quota refused."""
MIN_UNRESERVED_CONCURRENCY = 100
SPOT_ROLE = "AWSServiceRoleForEC2Spot"
LABELS = {OK: "ok", WARN: "warn", FAIL: "FAIL", UNKNOWN: "unknown"}


@dataclass(frozen=True)
class Finding:
    check: str
    status: str
    detail: str
    fix: str = ""


Clients = Callable[[str], Any]


def _error(exc: Exception) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict) and response.get("Error"):
        error = response["Error"]
        return f"{error.get('Code', 'error')}: {error.get('Message', '')}".strip()
    return f"{type(exc).__name__}: {exc}"


class Doctor:
    """The checks of one stack, with `clients(service)` for every call (boto3 clients, or fakes)."""

    def __init__(self, clients: Clients, *, stack: str, region: str) -> None:
        self.clients = clients
        self.stack = stack
        self.region = region
        self.parameters: dict[str, str] = {}
        self.outputs: dict[str, str] = {}
        self.gpus_quotas_allow: int | None = None
        """GPUs of the allowed types the EC2 vCPU quotas read by `ec2_quotas` let the account run."""

    def run(self) -> list[Finding]:
        try:
            (described,) = self.clients("cloudformation").describe_stacks(StackName=self.stack)["Stacks"]
        except Exception as exc:  # no stack: nothing else can be judged
            return [Finding("stack", FAIL, f"cannot describe stack {self.stack!r}: {_error(exc)}", "pass --stack NAME")]
        self.parameters = {p["ParameterKey"]: p.get("ParameterValue", "") for p in described.get("Parameters", [])}
        self.outputs = {o["OutputKey"]: o.get("OutputValue", "") for o in described.get("Outputs", [])}
        findings = [Finding("stack", OK, f"{self.stack}: {described.get('StackStatus', '?')}")]
        for check in (
            self.lambda_concurrency,
            self.ec2_quotas,
            self.fleet_cap,
            self.ebs_key,
            self.network,
            self.spot_role,
            self.alarm_subscribers,
            self.registries,
            self.cost_allocation_tags,
        ):
            try:
                findings += check()
            except Exception as exc:  # the call was refused or is not there: say which, go on
                findings.append(Finding(check.__name__.replace("_", " "), UNKNOWN, f"could not check: {_error(exc)}"))
        return findings

    # ---- the checks --------------------------------------------------------------------------------
    def lambda_concurrency(self) -> list[Finding]:
        limits = self.clients("lambda").get_account_settings()["AccountLimit"]
        total, unreserved = int(limits["ConcurrentExecutions"]), int(limits["UnreservedConcurrentExecutions"])
        reconciler = self.parameters.get("ReconcilerReservedConcurrency", "")
        reports = self.parameters.get("ReportsReservedConcurrency", "")
        reserved = reconciler or reports
        detail = (
            f"account quota {total}, {unreserved} unreserved; reservations: reconciler {reconciler or 'none'},"
            f" reports {reports or 'none'}"
        )
        if total - MIN_UNRESERVED_CONCURRENCY < 1:
            fix = "ask Service Quotas for Lambda 'Concurrent executions' (L-B99A9384) of 1000 before reserving any"
            status = FAIL if reserved else WARN
            return [Finding("lambda concurrency", status, detail + f": no reservation fits under {total}", fix)]
        return [Finding("lambda concurrency", OK, detail)]

    def ec2_quotas(self) -> list[Finding]:
        types = [t for t in self.parameters.get("AllowedInstanceTypes", "").split(",") if t]
        if not types:
            return [Finding("ec2 quotas", UNKNOWN, "the stack has no AllowedInstanceTypes parameter")]
        described = self.clients("ec2").describe_instance_types(InstanceTypes=types)["InstanceTypes"]
        vcpus = {t["InstanceType"]: int(t["VCpuInfo"]["DefaultVCpus"]) for t in described}
        gpus = {
            t["InstanceType"]: sum(g.get("Count", 0) for g in t.get("GpuInfo", {}).get("Gpus", [])) for t in described
        }
        allowed = 0
        findings = []
        quotas = self.clients("service-quotas")
        for (family, market), (code, name) in QUOTAS.items():
            members = [t for t in types if _family(t) == family and t in vcpus]
            if not members:
                continue
            biggest = max(members, key=lambda t: vcpus[t])
            need = vcpus[biggest]
            try:
                value = float(quotas.get_service_quota(ServiceCode="ec2", QuotaCode=code)["Quota"]["Value"])
            except Exception as exc:
                findings.append(Finding(f"quota {code}", UNKNOWN, f"{name}: could not read: {_error(exc)}"))
                continue
            dense = [t for t in members if gpus.get(t)]
            if dense:  # the most GPUs this quota's vCPUs can hold: in the type with the fewest vCPUs per GPU
                best = min(dense, key=lambda t: vcpus[t] / gpus[t])
                allowed += int(value // vcpus[best]) * gpus[best]
            detail = f"{name} ({market}): {value:g} vCPUs; one {biggest} needs {need}"
            if value < need:
                fix = f"aws service-quotas request-service-quota-increase --service-code ec2 --quota-code {code} --desired-value {need}"
                findings.append(Finding(f"quota {code}", FAIL, detail, fix))
            else:
                findings.append(Finding(f"quota {code}", OK, detail))
        self.gpus_quotas_allow = allowed
        return findings

    def fleet_cap(self) -> list[Finding]:
        """The team configuration's fleet cap against what the EC2 vCPU quotas allow: above them, jobs
        wait for EC2's quota refusals (in no order) rather than in gpujobs' queue (in fair-share order)."""
        allowed = self.gpus_quotas_allow
        if allowed is None:
            return [Finding("fleet cap", UNKNOWN, "the EC2 vCPU quotas could not be read")]
        name = self.parameters.get("TeamsParameterName", "")
        cap = None
        if name:
            from gpujobs.domain.teams import parse_team_config

            cap = parse_team_config(self.clients("ssm").get_parameter(Name=name)["Parameter"]["Value"]).fleet.max_gpus
        quotas = f"the EC2 vCPU quotas allow about {allowed} GPUs of the allowed types (on-demand and spot)"
        fix = f'set "fleet": {{"max_gpus": {allowed}}} in the team configuration (docs/deploy.md, Quotas)'
        if cap is None:
            return [Finding("fleet cap", WARN, f"no fleet cap; {quotas}: jobs past them wait for EC2 refusals", fix)]
        if cap > allowed:
            return [
                Finding("fleet cap", WARN, f"fleet.max_gpus {cap} is above the {allowed} GPUs the quotas allow", fix)
            ]
        return [Finding("fleet cap", OK, f"fleet.max_gpus {cap}; {quotas}")]

    def ebs_key(self) -> list[Finding]:
        ec2 = self.clients("ec2")
        default = ec2.get_ebs_default_kms_key_id()["KmsKeyId"]
        stack_key = self.parameters.get("EbsKmsKeyArn", "")
        metadata = self.clients("kms").describe_key(KeyId=default)["KeyMetadata"]
        if metadata.get("KeyManager") != "CUSTOMER":
            where = f"the stack's key {stack_key}" if stack_key else "the account's default (AWS managed) key"
            return [Finding("ebs key", OK, f"root volumes use {where}")]
        if stack_key:
            return [Finding("ebs key", OK, f"the default EBS key is customer managed; the stack names {stack_key}")]
        return [
            Finding(
                "ebs key",
                FAIL,
                f"the account's default EBS key {metadata.get('Arn', default)} is customer managed and the stack "
                "has no EbsKmsKeyArn: instances die at boot",
                f"sam deploy --parameter-overrides EbsKmsKeyArn={metadata.get('Arn', default)}",
            )
        ]

    def network(self) -> list[Finding]:
        ec2 = self.clients("ec2")
        subnet_ids = [s for s in self.parameters.get("SubnetIds", "").split(",") if s]
        subnets = ec2.describe_subnets(SubnetIds=subnet_ids)["Subnets"]
        findings = []
        public = [s["SubnetId"] for s in subnets if s.get("MapPublicIpOnLaunch")]
        if public:
            detail = f"{', '.join(public)} map public IPs on launch (the launcher asks for none; an EFA gang cannot)"
            fix = "aws ec2 modify-subnet-attribute --no-map-public-ip-on-launch --subnet-id SUBNET"
            findings.append(Finding("public ips", WARN, detail, fix))
        without_nat = [s for s in subnets if not self._has_nat_route(ec2, s)]
        if not without_nat:
            return [*findings, Finding("network", OK, f"{len(subnets)} subnet(s), each with a NAT route")]
        vpcs = sorted({s["VpcId"] for s in without_nat})
        endpoints = ec2.describe_vpc_endpoints(Filters=[{"Name": "vpc-id", "Values": vpcs}])["VpcEndpoints"]
        prefix = f"com.amazonaws.{self.region}."
        present = {
            e["ServiceName"].removeprefix(prefix)
            for e in endpoints
            if e["ServiceName"].startswith(prefix) and e.get("State", "available").lower() == "available"
        }
        no_dns = sorted(
            e["ServiceName"].removeprefix(prefix)
            for e in endpoints
            if e.get("VpcEndpointType") == "Interface" and not e.get("PrivateDnsEnabled")
        )
        missing = [name for name in REQUIRED_ENDPOINTS if name not in present]
        names = ", ".join(s["SubnetId"] for s in without_nat)
        if missing:
            fix = f"create VPC endpoints com.amazonaws.{self.region}.{{{','.join(missing)}}} (docs/deploy.md), or a NAT route"
            findings.append(
                Finding("network", FAIL, f"{names}: no NAT route and no endpoint for {', '.join(missing)}", fix)
            )
        else:
            findings.append(Finding("network", OK, f"{names}: no NAT route; every endpoint is there"))
        if no_dns:
            findings.append(
                Finding("endpoint dns", WARN, f"private DNS is off for {', '.join(no_dns)}: the SDKs will not use them")
            )
        return findings

    @staticmethod
    def _has_nat_route(ec2: Any, subnet: dict[str, Any]) -> bool:
        tables = ec2.describe_route_tables(Filters=[{"Name": "association.subnet-id", "Values": [subnet["SubnetId"]]}])
        found = tables["RouteTables"]
        if not found:  # the VPC's main table
            main = [{"Name": "vpc-id", "Values": [subnet["VpcId"]]}, {"Name": "association.main", "Values": ["true"]}]
            found = ec2.describe_route_tables(Filters=main)["RouteTables"]
        default_routes = [r for t in found for r in t.get("Routes", []) if r.get("DestinationCidrBlock") == "0.0.0.0/0"]
        return any(
            r.get("NatGatewayId") or r.get("TransitGatewayId") or r.get("NetworkInterfaceId") for r in default_routes
        )

    def spot_role(self) -> list[Finding]:
        iam = self.clients("iam")
        try:
            iam.get_role(RoleName=SPOT_ROLE)
        except Exception as exc:
            if "NoSuchEntity" not in _error(exc):
                raise
            fix = "aws iam create-service-linked-role --aws-service-name spot.amazonaws.com"
            return [Finding("spot role", WARN, f"{SPOT_ROLE} does not exist: every spot launch is refused", fix)]
        return [Finding("spot role", OK, f"{SPOT_ROLE} exists")]

    def alarm_subscribers(self) -> list[Finding]:
        topic = self.parameters.get("AlarmTopicArn", "")
        if not topic:
            found = self.clients("cloudformation").describe_stack_resource(
                StackName=self.stack, LogicalResourceId="AlarmTopic"
            )
            topic = found["StackResourceDetail"]["PhysicalResourceId"]
        subscriptions = self.clients("sns").list_subscriptions_by_topic(TopicArn=topic)["Subscriptions"]
        confirmed = [s for s in subscriptions if s.get("SubscriptionArn", "").startswith("arn:")]
        if not confirmed:
            pending = len(subscriptions)
            detail = f"{topic} has no confirmed subscriber ({pending} pending): the alarms reach nobody"
            return [Finding("alarm topic", WARN, detail, "deploy with AlarmEmail=you@example.com and confirm the mail")]
        return [Finding("alarm topic", OK, f"{topic}: {len(confirmed)} confirmed subscriber(s)")]

    def registries(self) -> list[Finding]:
        extra = [r for r in self.parameters.get("ImageRepositoryArns", "").split(",") if r]
        detail = "this account's repositories in this region" + (f", and {', '.join(extra)}" if extra else " only")
        return [Finding("image registries", OK, f"instances may pull from {detail}")]

    def cost_allocation_tags(self) -> list[Finding]:
        detail = "not checked: cost allocation tags are read in the management account"
        return [
            Finding(
                "cost allocation tags", UNKNOWN, detail, "aws ce list-cost-allocation-tags --tag-keys gpujobs:stack"
            )
        ]


def render(findings: list[Finding]) -> str:
    width = max(len(f.check) for f in findings)
    lines = []
    for f in findings:
        lines.append(f"{LABELS[f.status]:<8}{f.check:<{width + 2}}{f.detail}")
        if f.fix and f.status != OK:
            lines.append(f"{'':<8}{'':<{width + 2}}fix: {f.fix}")
    counts = {status: sum(f.status == status for f in findings) for status in (FAIL, WARN, UNKNOWN)}
    lines.append(f"{counts[FAIL]} failed, {counts[WARN]} warning(s), {counts[UNKNOWN]} not checked")
    return "\n".join(lines)


def cmd_doctor(args: argparse.Namespace) -> int:
    """Exit 1 when any check fails; warnings and unchecked lines do not."""
    from gpujobs_cli.resources import Resources

    resources = Resources(stack=args.stack, region=args.region)
    findings = Doctor(resources.client, stack=args.stack, region=resources.region_name).run()
    if args.json:
        print(json.dumps([asdict(f) for f in findings], indent=2))
    else:
        print(f"gpujobs doctor: stack {args.stack} in {resources.region_name}")
        print(render(findings))
    return 1 if any(f.status == FAIL for f in findings) else 0
