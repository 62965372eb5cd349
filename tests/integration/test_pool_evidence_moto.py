"""The stack's spot evidence (`domain.pools`) kept in the jobs table (on moto) and in memory alike:
each job attempt's reclaim once however often it is recorded, concurrent recorders never losing
each other's entries, a day's items read back across midnight, nothing older than the horizon, and
an `expires_at` that lets the table's TTL delete a day once no ranking reads it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import pytest
from moto import mock_aws

from gpujobs.adapters.pool_evidence import KEEP_FOR, DynamoPoolEvidence, day_pk
from gpujobs.domain.pools import HORIZON, Reclaim
from gpujobs.service.pool_evidence import PoolEvidence
from gpujobs_fakes.evidence import InMemoryPoolEvidence
from gpujobs_local.template import table_definition

pytestmark = pytest.mark.integration

NOW = datetime(2026, 6, 2, 0, 30, tzinfo=UTC)  # half an hour past midnight: yesterday's items count


def reclaim(hours_ago: float, key: str, zone: str = "us-east-1a") -> Reclaim:
    return Reclaim("g5.xlarge", zone, NOW - timedelta(hours=hours_ago), key)


class OneRequestAtATime:
    """The client, each request applied whole before the next: DynamoDB applies a conditional update
    atomically, moto does not under threads (two `attribute_not_exists` writes could both pass). The
    requests of concurrent recorders still interleave freely, so their lost races are real."""

    def __init__(self, client: Any) -> None:
        self._client, self._lock = client, threading.Lock()
        self.exceptions = client.exceptions
        self.first_requests_meet: threading.Barrier | None = None
        """Set: each thread's first request waits, once applied, for every other thread's first."""
        self._met: set[int] = set()

    def __getattr__(self, name: str) -> Any:
        call = getattr(self._client, name)

        def applied_whole(**kwargs: Any) -> Any:
            try:
                with self._lock:
                    return call(**kwargs)
            finally:
                if self.first_requests_meet is not None and threading.get_ident() not in self._met:
                    self._met.add(threading.get_ident())
                    self.first_requests_meet.wait(timeout=10)

        return applied_whole


@pytest.fixture(params=["dynamodb", "memory"])
def evidence(request: pytest.FixtureRequest, aws_credentials: None) -> Iterator[PoolEvidence]:
    if request.param == "memory":
        yield InMemoryPoolEvidence()
        return
    with mock_aws():
        dynamodb = boto3.client("dynamodb", region_name="us-east-1")
        dynamodb.create_table(**table_definition(table_name="t"))
        yield DynamoPoolEvidence(table_name="t", client=OneRequestAtATime(dynamodb))  # type: ignore[arg-type]


def test_reclaims_are_read_back_across_days_once_each_and_only_within_the_horizon(evidence: PoolEvidence) -> None:
    evidence.record([reclaim(0.2, "j-1#1"), reclaim(1, "j-2#3"), reclaim(1, "j-2#3", zone="us-east-1b")])
    evidence.record([reclaim(0.2, "j-1#1")])  # the same reclaim, recorded again by a second walk
    evidence.record([reclaim(HORIZON / timedelta(hours=1) + 1, "j-0#9")])  # too old to read

    found = sorted((r.zone, r.key, r.at) for r in evidence.recent(now=NOW))

    assert found == [
        ("us-east-1a", "j-1#1", NOW - timedelta(hours=0.2)),
        ("us-east-1a", "j-2#3", NOW - timedelta(hours=1)),  # yesterday's item
        ("us-east-1b", "j-2#3", NOW - timedelta(hours=1)),
    ]


def test_concurrent_recorders_of_one_pool_keep_every_entry(evidence: PoolEvidence) -> None:
    client = getattr(evidence, "_ddb", None)
    if isinstance(client, OneRequestAtATime):  # all find no map first, so all race to make it: seven lose
        client.first_requests_meet = threading.Barrier(8)
    threads = [threading.Thread(target=evidence.record, args=([reclaim(0.1, f"j-{i}#1")],)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if isinstance(client, OneRequestAtATime):
        client.first_requests_meet = None
    assert sorted(r.key for r in evidence.recent(now=NOW)) == sorted(f"j-{i}#1" for i in range(8))


def test_a_days_item_expires_once_no_ranking_reads_it(aws_credentials: None) -> None:
    with mock_aws():
        dynamodb = boto3.client("dynamodb", region_name="us-east-1")
        dynamodb.create_table(**table_definition(table_name="t"))
        DynamoPoolEvidence(table_name="t", client=dynamodb).record([reclaim(0.2, "j-1#1")])
        (item,) = dynamodb.scan(TableName="t")["Items"]
    at = NOW - timedelta(hours=0.2)
    assert item["pk"]["S"] == day_pk(at) == "POOLS#2026-06-02"
    assert item["sk"]["S"] == "g5.xlarge#us-east-1a"
    assert int(item["expires_at"]["N"]) == int((at + KEEP_FOR).timestamp())
    assert KEEP_FOR > HORIZON
