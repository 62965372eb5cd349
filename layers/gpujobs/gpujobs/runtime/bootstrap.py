"""The one place that wires real AWS clients into the services.

Each handler checks its settings at import (`require_settings`), so a function deployed without
one fails its cold start instead of a job. Handlers then call `job_service()`, `reactions()`, ...
once per container; clients are created lazily, and each factory imports only what its use case
needs, so the submit function never loads the reconciler or the budget parser and importing a
handler (the cold start) costs only its own imports.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal, Protocol, cast, overload

import boto3
from botocore.config import Config

from gpujobs.adapters.budgets import BudgetsApiCheck, DynamoBudgetBook
from gpujobs.adapters.catalog import packaged_hardware
from gpujobs.adapters.clock import UtcClock
from gpujobs.adapters.cloudwatch import CloudWatchIdleAlarms, LambdaThrottles
from gpujobs.adapters.dynamodb import DynamoJobStore
from gpujobs.adapters.ec2 import Ec2Compute
from gpujobs.adapters.eventbus import EventBridgePublisher
from gpujobs.adapters.prices import Ec2Prices, packaged_on_demand_prices
from gpujobs.adapters.s3 import S3BlobStore
from gpujobs.adapters.secrets import SecretsClient, StackSecretReportKeys
from gpujobs.adapters.ssm import SsmSignaller
from gpujobs.adapters.teams import SsmTeamConfig
from gpujobs.runtime.settings import Need, Settings
from gpujobs.service.config import LaunchConfig
from gpujobs.service.jobs import JobService
from gpujobs.service.ports import Ports, UserDataTooLargeError

if TYPE_CHECKING:
    from botocore.client import BaseClient
    from types_boto3_budgets import BudgetsClient
    from types_boto3_cloudwatch import CloudWatchClient
    from types_boto3_dynamodb import DynamoDBClient
    from types_boto3_ec2 import EC2Client
    from types_boto3_events import EventBridgeClient
    from types_boto3_s3 import S3Client
    from types_boto3_ssm import SSMClient
    from types_boto3_sts import STSClient

    from gpujobs.adapters.price_list import PricingClient
    from gpujobs.adapters.quotas import ServiceQuotasClient
    from gpujobs.domain.rundoc import RunDocument, RunDocumentPointer
    from gpujobs.service.budgeting import BudgetReactions
    from gpujobs.service.job_sessions import JobSessions
    from gpujobs.service.outbox import Outbox
    from gpujobs.service.reactions import Reactions
    from gpujobs.service.reconcile import Reconciler
    from gpujobs.service.reports import Reports

    AwsService = Literal["budgets", "cloudwatch", "dynamodb", "ec2", "events", "s3", "ssm", "sts"]

_CONFIG = Config(retries={"mode": "standard", "max_attempts": 5}, connect_timeout=5, read_timeout=20)


class InvocationTimeLeft(threading.local):
    """`Ports.time_left` in a Lambda container: the remaining time of the invocation in progress.

    The ports are built once per container, the context is new each invocation: every handler that
    may launch binds its context first (`bind_context`), so a ladder walk stops short of this
    invocation's deadline, never a previous one's. Per thread: the local cloud runs handlers on several."""

    remaining_ms: Callable[[], int] | None = None

    def bind(self, remaining_ms: Callable[[], int] | None) -> None:
        self.remaining_ms = remaining_ms

    def __call__(self) -> timedelta | None:
        remaining = self.remaining_ms
        return None if remaining is None else timedelta(milliseconds=remaining())


TIME_LEFT = InvocationTimeLeft()


class _HasRemainingTime(Protocol):
    def get_remaining_time_in_millis(self) -> int: ...


def bind_context(context: _HasRemainingTime) -> None:
    """The first line of a handler that may launch: its walks stop before this invocation's deadline."""
    TIME_LEFT.bind(context.get_remaining_time_in_millis)


# One overload per service the control plane calls, so that mypy checks each adapter gets its client.
@overload
def lazy_client(service: Literal["budgets"], settings: Settings) -> BudgetsClient: ...
@overload
def lazy_client(service: Literal["cloudwatch"], settings: Settings) -> CloudWatchClient: ...
@overload
def lazy_client(service: Literal["dynamodb"], settings: Settings) -> DynamoDBClient: ...
@overload
def lazy_client(service: Literal["ec2"], settings: Settings) -> EC2Client: ...
@overload
def lazy_client(service: Literal["events"], settings: Settings) -> EventBridgeClient: ...
@overload
def lazy_client(service: Literal["s3"], settings: Settings) -> S3Client: ...
@overload
def lazy_client(service: Literal["ssm"], settings: Settings) -> SSMClient: ...
@overload
def lazy_client(service: Literal["sts"], settings: Settings) -> STSClient: ...
def lazy_client(service: AwsService, settings: Settings) -> BaseClient:
    """The service's client, created on its first use: every function wires every port and pays only
    for the clients its path calls."""
    return cast(
        "BaseClient", _LazyClient(functools.partial(boto3.client, service, region_name=settings.region, config=_CONFIG))
    )


def service_quotas_client(settings: Settings) -> ServiceQuotasClient:
    """Service Quotas' client, created on first use (no typed stubs: the adapter's protocol types it)."""
    make = functools.partial(boto3.client, "service-quotas", region_name=settings.region, config=_CONFIG)
    return cast("ServiceQuotasClient", _LazyClient(make))


def pricing_client(settings: Settings) -> PricingClient:
    """The Price List's client at the endpoint nearest the stack (`adapters.price_list`), created on first use."""
    from gpujobs.adapters.price_list import price_list_region

    make = functools.partial(boto3.client, "pricing", region_name=price_list_region(settings.region), config=_CONFIG)
    return cast("PricingClient", _LazyClient(make))


_CREATING = threading.Lock()
"""boto3's default session is not safe to create clients from on two threads at once (the local
cloud runs handlers on several)."""


class _LazyClient:
    def __init__(self, make: Callable[[], BaseClient]) -> None:
        self._make = make
        self._client: BaseClient | None = None
        _WIRED.append(self)

    def made(self) -> BaseClient:
        if self._client is None:
            with _CREATING:
                if self._client is None:
                    self._client = self._make()
        return self._client

    def __getattr__(self, name: str) -> Any:
        return getattr(self.made(), name)


_WIRED: list[_LazyClient] = []


def make_every_client() -> None:
    """Create now every client the wired ports hold (the local cloud: its endpoint and credentials
    are those of this moment, and later changes of the environment must not reach them)."""
    for lazy in list(_WIRED):
        lazy.made()


class StoredBootstrapUserData:
    """Renders user data whose loader runs the bootstrap stored in the stack's bucket.

    The bundle is stored (conditionally, once per content) before the first user data that names it
    leaves this container. `gpujobs.instance.userdata` is imported on first use: rendering is a
    launch's business, not the cold start's.
    """

    def __init__(self, blobs: S3BlobStore, *, bucket: str, region: str) -> None:
        self._blobs = blobs
        self._bucket = bucket
        self._region = region
        self._stored = False

    def __call__(self, doc: RunDocument | RunDocumentPointer, /) -> bytes:
        from gpujobs.instance import userdata

        if not self._stored:
            self._blobs.put_once(userdata.bootstrap_key(), userdata.bootstrap_bundle())
            self._stored = True
        try:
            return userdata.render_user_data(doc, bucket=self._bucket, region=self._region)
        except userdata.UserDataTooLargeError as exc:
            raise UserDataTooLargeError(exc.size) from exc


def build_ports(settings: Settings) -> Ports:
    """The real ports, once per Lambda container; no client is created before its first call."""
    # Imported here, not at the top: the handlers configure Powertools (observability) from their own
    # environment when they are imported; wiring must not create its logger and metrics earlier.
    from gpujobs.adapters.offerings import Ec2InstanceTypeOfferings
    from gpujobs.adapters.placement_scores import Ec2PlacementScores
    from gpujobs.adapters.pool_evidence import DynamoPoolEvidence
    from gpujobs.adapters.price_list import PriceListOnDemand
    from gpujobs.adapters.quotas import Ec2ServiceQuotas
    from gpujobs.runtime.observability import EmfMetrics, count_record_too_large

    blobs = S3BlobStore(client=lazy_client("s3", settings), bucket=settings.checkpoint_bucket)
    dynamodb = lazy_client("dynamodb", settings)
    ssm = lazy_client("ssm", settings)
    ec2 = lazy_client("ec2", settings)
    return Ports(
        store=DynamoJobStore(table_name=settings.table_name, client=dynamodb, on_too_large=count_record_too_large),
        compute=Ec2Compute(
            client=ec2,
            launch_template_id=settings.launch_template_id,
            security_group_id=settings.security_group_id,
            subnet_ids=settings.subnet_ids,
            stack_name=settings.stack_name,
        ),
        publisher=EventBridgePublisher(client=lazy_client("events", settings), bus_name=settings.event_bus_name),
        blobs=blobs,
        clock=UtcClock(),
        alarms=CloudWatchIdleAlarms(client=lazy_client("cloudwatch", settings), stack_name=settings.stack_name),
        signaller=SsmSignaller(client=ssm, document_name=settings.checkpoint_document),
        budgets=DynamoBudgetBook(table_name=settings.table_name, client=dynamodb),
        report_keys=report_keys(settings),
        prices=Ec2Prices(
            client=ec2, on_demand=PriceListOnDemand(client=pricing_client(settings), region=settings.region)
        ),
        render_user_data=StoredBootstrapUserData(blobs, bucket=settings.checkpoint_bucket, region=settings.region),
        teams=SsmTeamConfig(client=ssm, parameter_name=settings.teams_parameter) if settings.teams_parameter else None,
        budget_has_room=BudgetsApiCheck(
            budgets_client=lazy_client("budgets", settings),
            sts_client=lazy_client("sts", settings),
            stack_name=settings.stack_name,
        ),
        metrics=EmfMetrics(),
        quotas=Ec2ServiceQuotas(client=service_quotas_client(settings)),
        pool_evidence=DynamoPoolEvidence(table_name=settings.table_name, client=dynamodb),
        offerings=Ec2InstanceTypeOfferings(client=ec2, region=settings.region),
        placement_scores=Ec2PlacementScores(client=ec2, region=settings.region),
        time_left=TIME_LEFT,
        reports_throttled_at=reports_throttles(settings),
    )


def reports_throttles(settings: Settings) -> Callable[[datetime], datetime | None]:
    """The Reports function's throttles, read where the template names it (the reconciler only)."""
    if not settings.reports_function_name:
        return lambda _now: None
    return LambdaThrottles(client=lazy_client("cloudwatch", settings), function_name=settings.reports_function_name)


def launch_config(settings: Settings) -> LaunchConfig:
    return LaunchConfig(
        checkpoint_bucket=settings.checkpoint_bucket,
        event_bus_name=settings.event_bus_name,
        region=settings.region,
        allowed_instance_types=settings.allowed_instance_types,
        priced_instance_types=frozenset(packaged_on_demand_prices()),
        job_role_arn=settings.job_role_arn,
        credentials_function=settings.credentials_function,
        stack_name=settings.stack_name,
        job_log_group=settings.job_log_group,
        hardware=packaged_hardware(),
    )


def report_keys(settings: Settings) -> StackSecretReportKeys:
    """Read lazily: only a launch or a report verification reads the secret (and may, by IAM)."""
    secrets = cast("SecretsClient", boto3.client("secretsmanager", region_name=settings.region, config=_CONFIG))
    return StackSecretReportKeys(
        client=secrets,
        secret_id=settings.report_secret_arn,
        grace=timedelta(hours=settings.report_secret_grace_hours),
    )


@functools.cache
def settings() -> Settings:
    return Settings.from_env(os.environ)


def require_settings(*needs: Need) -> Settings:
    """The settings, checked for what this function `needs`: SettingsError names every variable missing.

    Called at module level by each handler, so the error surfaces at import, in the cold start.
    """
    Settings.from_env(os.environ, needs=needs)
    return settings()


@functools.cache
def ports() -> Ports:
    return build_ports(settings())


@functools.cache
def job_service() -> JobService:
    return JobService(ports=ports(), config=launch_config(settings()))


@functools.cache
def reactions() -> Reactions:
    from gpujobs.service.reactions import Reactions

    return Reactions(ports=ports(), jobs=job_service())


@functools.cache
def reports() -> Reports:
    from gpujobs.service.reports import Reports

    return Reports(ports=ports(), reactions=reactions())


@functools.cache
def reconciler() -> Reconciler:
    from gpujobs.service.reconcile import Reconciler

    kept_for = timedelta(days=settings().checkpoint_retention_days)
    return Reconciler(ports=ports(), jobs=job_service(), reactions=reactions(), object_retention=kept_for)


@functools.cache
def budget_reactions() -> BudgetReactions:
    from gpujobs.service.budgeting import BudgetReactions

    return BudgetReactions(ports=ports(), reactions=reactions(), stack_name=settings().stack_name)


@functools.cache
def outbox() -> Outbox:
    """The Publisher function's use case: the table's stream to the stack's bus. It needs only the
    bus; the other ports are not built."""
    from gpujobs.service.outbox import Outbox

    config = settings()
    return Outbox(EventBridgePublisher(client=lazy_client("events", config), bus_name=config.event_bus_name))


def unsigned_sts_client(settings: Settings) -> STSClient:
    """An STS client that signs nothing: it carries the instance's own signed proof (`adapters.sts_sessions`)."""
    from botocore import UNSIGNED

    unsigned = _CONFIG.merge(Config(signature_version=UNSIGNED))
    client: STSClient = boto3.client("sts", region_name=settings.region, config=unsigned)
    return client


@functools.cache
def job_sessions() -> JobSessions:
    """The credentials function's use case: its own STS endpoint verifies proofs, the job store reads
    records, and the team configuration names the data buckets (read on first use, once per container)."""
    from gpujobs.adapters.sts_sessions import StsCallerIdentity, StsJobRoleSessions
    from gpujobs.domain.teams import TeamDirectory
    from gpujobs.service.job_sessions import JobSessions

    config = settings()
    sts = lazy_client("sts", config)
    ssm = lazy_client("ssm", config)
    teams = SsmTeamConfig(client=ssm, parameter_name=config.teams_parameter) if config.teams_parameter else None
    directory = functools.cache(lambda: TeamDirectory.open() if teams is None else teams.load())
    return JobSessions(
        store=DynamoJobStore(table_name=config.table_name, client=lazy_client("dynamodb", config)),
        identities=StsCallerIdentity(client=unsigned_sts_client(config)),
        sessions=StsJobRoleSessions(client=sts, role_arn=config.job_role_arn),
        team_directory=directory,
        stack_name=config.stack_name,
        bucket=config.checkpoint_bucket,
        instance_role_arn=config.instance_role_arn,
    )


def reset() -> None:
    """Forget every wired service (a fresh Lambda container); tests and the local cloud use it."""
    for cached in (
        settings,
        ports,
        job_service,
        reactions,
        reports,
        reconciler,
        budget_reactions,
        job_sessions,
        outbox,
    ):
        cached.cache_clear()
    _WIRED.clear()
