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
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Literal, cast, overload

import boto3
from botocore.config import Config

from gpujobs.adapters.budgets import DynamoBudgetBook
from gpujobs.adapters.catalog import packaged_hardware
from gpujobs.adapters.cloudwatch import CloudWatchIdleAlarms
from gpujobs.adapters.dynamodb import DynamoJobStore
from gpujobs.adapters.ec2 import Ec2Compute
from gpujobs.adapters.eventbus import EventBridgePublisher
from gpujobs.adapters.prices import packaged_on_demand_prices
from gpujobs.adapters.s3 import S3BlobStore
from gpujobs.adapters.secrets import SecretsClient, StackSecretReportKeys
from gpujobs.adapters.teams import SsmTeamConfig
from gpujobs.domain.rundoc import RunDocument, RunDocumentPointer
from gpujobs.runtime.settings import Need, Settings
from gpujobs.service.changes import WriteCounter
from gpujobs.service.jobs import JobService, LaunchConfig

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

    from gpujobs.service.budgeting import BudgetReactions
    from gpujobs.service.reactions import Reactions
    from gpujobs.service.reconcile import Reconciler
    from gpujobs.service.reports import Reports

    AwsService = Literal["budgets", "cloudwatch", "dynamodb", "ec2", "events", "s3", "ssm", "sts"]

_CONFIG = Config(retries={"mode": "standard", "max_attempts": 5}, connect_timeout=5, read_timeout=20)


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)


# One overload per service the control plane calls, so that mypy checks each adapter gets its client.
@overload
def client(service: Literal["budgets"], settings: Settings) -> BudgetsClient: ...
@overload
def client(service: Literal["cloudwatch"], settings: Settings) -> CloudWatchClient: ...
@overload
def client(service: Literal["dynamodb"], settings: Settings) -> DynamoDBClient: ...
@overload
def client(service: Literal["ec2"], settings: Settings) -> EC2Client: ...
@overload
def client(service: Literal["events"], settings: Settings) -> EventBridgeClient: ...
@overload
def client(service: Literal["s3"], settings: Settings) -> S3Client: ...
@overload
def client(service: Literal["ssm"], settings: Settings) -> SSMClient: ...
@overload
def client(service: Literal["sts"], settings: Settings) -> STSClient: ...
def client(service: AwsService, settings: Settings) -> BaseClient:
    return boto3.client(service, region_name=settings.region, config=_CONFIG)


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

    def __call__(self, doc: RunDocument | RunDocumentPointer) -> bytes:
        from gpujobs.instance.userdata import bootstrap_bundle, bootstrap_key, render_user_data

        if not self._stored:
            self._blobs.put_once(bootstrap_key(), bootstrap_bundle())
            self._stored = True
        return render_user_data(doc, bucket=self._bucket, region=self._region)


def build_job_service(settings: Settings) -> JobService:
    # Imported here, not at the top: the handlers configure Powertools (observability) from their own
    # environment when they are imported; wiring must not create its logger and metrics earlier.
    from gpujobs.runtime.observability import EmfMetrics, count_record_too_large

    blobs = S3BlobStore(client=client("s3", settings), bucket=settings.checkpoint_bucket)
    return JobService(
        store=DynamoJobStore(
            table_name=settings.table_name, client=client("dynamodb", settings), on_too_large=count_record_too_large
        ),
        compute=Ec2Compute(
            client=client("ec2", settings),
            launch_template_id=settings.launch_template_id,
            security_group_id=settings.security_group_id,
            subnet_ids=settings.subnet_ids,
            stack_name=settings.stack_name,
        ),
        publisher=EventBridgePublisher(client=client("events", settings), bus_name=settings.event_bus_name),
        blobs=blobs,
        clock=SystemClock(),
        config=LaunchConfig(
            checkpoint_bucket=settings.checkpoint_bucket,
            event_bus_name=settings.event_bus_name,
            region=settings.region,
            allowed_instance_types=settings.allowed_instance_types,
            priced_instance_types=frozenset(packaged_on_demand_prices()),
            job_role_arn=settings.job_role_arn,
            job_log_group=settings.job_log_group,
            hardware=packaged_hardware(),
        ),
        render_user_data=StoredBootstrapUserData(blobs, bucket=settings.checkpoint_bucket, region=settings.region),
        budgets=DynamoBudgetBook(table_name=settings.table_name, client=client("dynamodb", settings)),
        alarms=CloudWatchIdleAlarms(client=client("cloudwatch", settings), stack_name=settings.stack_name),
        report_keys=report_keys(settings),
        teams=SsmTeamConfig(client=client("ssm", settings), parameter_name=settings.teams_parameter)
        if settings.teams_parameter
        else None,
        written=WriteCounter(EmfMetrics(), packaged_on_demand_prices()),
    )


def report_keys(settings: Settings) -> StackSecretReportKeys:
    """Read lazily: only a launch or a report verification reads the secret (and may, by IAM)."""
    secrets = cast("SecretsClient", boto3.client("secretsmanager", region_name=settings.region, config=_CONFIG))
    return StackSecretReportKeys(client=secrets, secret_id=settings.report_secret_arn)


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
def job_service() -> JobService:
    return build_job_service(settings())


@functools.cache
def reactions() -> Reactions:
    from gpujobs.adapters.ssm import SsmSignaller
    from gpujobs.service.reactions import Reactions

    current = settings()
    signaller = SsmSignaller(client=client("ssm", current), document_name=current.checkpoint_document)
    return Reactions(jobs=job_service(), signaller=signaller)


@functools.cache
def reports() -> Reports:
    from gpujobs.service.reports import Reports

    return Reports(reactions=reactions(), keys=job_service().report_keys)


@functools.cache
def reconciler() -> Reconciler:
    from gpujobs.adapters.budgets import BudgetsApiCheck
    from gpujobs.adapters.prices import Ec2Prices
    from gpujobs.service.reconcile import Reconciler

    current = settings()
    return Reconciler(
        reactions=reactions(),
        prices=Ec2Prices(client=client("ec2", current)),
        budget_has_room=BudgetsApiCheck(
            budgets_client=client("budgets", current), sts_client=client("sts", current), stack_name=current.stack_name
        ),
    )


@functools.cache
def budget_reactions() -> BudgetReactions:
    from gpujobs.service.budgeting import BudgetReactions

    return BudgetReactions(reactions=reactions(), stack_name=settings().stack_name)


def reset() -> None:
    """Forget every wired service (a fresh Lambda container); tests and the local cloud use it."""
    for cached in (settings, job_service, reactions, reports, reconciler, budget_reactions):
        cached.cache_clear()
