"""The reconciler's tick with thousands of running jobs (issue 19, item 14).

It used to read every RUNNING job with two consistent GetItems (three with a deadline), in the
order the index listed them, with no deadline of its own: near 4,000 jobs the 120 s tick
overflowed and the jobs listed last (the least recently updated: a hung one) were never reached.
Now it reads them 100 at a time (one BatchGetItem) just before their repairs, decides on what it
read, goes least recently updated first, and stops repairing `REPAIR_RESERVE` before its deadline
so the orphan sweep and the launch work still get their turn. Time is the fake clock's: the batch
read is made to cost it; nothing sleeps.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from gpujobs.domain.job import Job
from gpujobs.domain.states import JobState
from gpujobs.service.reconcile import READ_BATCH, REPAIR_RESERVE
from gpujobs.service.repairs import Repair
from tests.service.conftest import World, spec


class SlowBatchReads:
    """The world's store, but each batch read takes `seconds` of the fake clock; reads are counted."""

    def __init__(self, world: World, seconds: float) -> None:
        self._store, self._world, self._seconds = world.store, world, seconds
        self.batch_reads: list[int] = []
        self.gets = 0

    def get_many(self, job_ids: Any, **kwargs: Any) -> dict[str, Job]:
        self.batch_reads.append(len(job_ids))
        self._world.clock.advance(seconds=self._seconds)
        return self._store.get_many(job_ids, **kwargs)

    def get(self, job_id: str) -> Job:
        self.gets += 1
        return self._store.get(job_id)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def running_jobs(world: World, count: int, *, first: int = 0) -> list[Job]:
    jobs = [world.submit(spec(), message_id=f"msg-{first + n}").job for n in range(count)]
    assert all(job.state is JobState.RUNNING for job in jobs)
    return jobs


def test_a_tick_reads_its_running_jobs_in_batches_and_no_job_twice(world: World) -> None:
    running_jobs(world, 250)
    store = SlowBatchReads(world, seconds=0)
    world.rewire(store=store)

    report = world.reconciler.run()

    assert store.batch_reads == [READ_BATCH, READ_BATCH, 50]
    assert store.gets == 0  # every repair decided on the batch's record: nothing to write, nothing read again
    assert report.repairs[Repair.ERRORS] == 0


def test_a_tick_short_of_time_repairs_the_least_recently_updated_first_and_defers_the_rest(world: World) -> None:
    # a job whose trainer never reported, launched long before the others (a hung NCCL init)
    [hung] = running_jobs(world, 1)
    world.clock.advance(minutes=hung.require_spec().trainer.first_heartbeat_minutes + 5)
    others = running_jobs(world, 249, first=1)
    store = SlowBatchReads(world, seconds=40)
    world.rewire(store=store)

    # room for two batches before the reserve: 40 s each, the third would start past it
    deadline = world.clock.now() + REPAIR_RESERVE + timedelta(seconds=50)
    report = world.reconciler.run(deadline=deadline)

    assert store.batch_reads == [READ_BATCH, READ_BATCH]
    assert report.repairs[Repair.RUNNING_REPAIRS_DEFERRED_TO_THE_NEXT_RUN] == 50
    assert report.repairs[Repair.HUNG_ATTEMPTS_DUMPED] == 1  # listed last by the index, repaired first
    assert world.signaller.dumps == [(hung.instance_ids, f"gpujobs-{hung.job_id}-a1")]  # its kill follows the dump
    # the jobs it had no time for keep their instances and their idle alarms
    deferred = others[-50:]
    assert all(world.compute.instances[j.instance_ids[0]].state == "running" for j in deferred)
    assert all(j.instance_ids[0] in world.alarms.alarms for j in deferred)
    assert report.repairs[Repair.IDLE_ALARMS_DELETED] == 0


def test_a_failed_batch_read_falls_back_to_reading_each_job(world: World) -> None:
    running_jobs(world, 3)
    store = SlowBatchReads(world, seconds=0)

    def refuses(*_args: Any, **_kwargs: Any) -> dict[str, Job]:
        raise RuntimeError("ProvisionedThroughputExceededException")

    store.get_many = refuses  # type: ignore[method-assign]
    world.rewire(store=store)

    report = world.reconciler.run()

    assert store.gets == 3
    assert report.repairs[Repair.ERRORS] == 0


def test_a_tick_short_of_time_still_terminates_the_overdue_survivors_of_a_deferred_jobs_reclaimed_gang(
    world: World,
) -> None:
    """Survivors are billed GPUs outliving their replacement's start: a RUNNING job whose repairs
    wait for the next run does not keep them (they used to wait with the repairs)."""
    running_jobs(world, 200)
    whole = spec(nodes=2, checkpoint="directory")  # replaced whole at a warning (no regroup: `domain.regroup`)
    gang = world.store.get(world.submit(whole, message_id="msg-gang").job.job_id)
    world.reactions.spot_warning(gang.instance_ids[0])
    world.compute.terminate(gang.instance_ids[:1])  # spot takes the warned node; the other's trainer hangs
    world.reactions.instance_state(gang.instance_ids[0], "terminated")
    replaced = world.store.get(gang.job_id)
    assert replaced.state is JobState.RUNNING
    assert replaced.attempt_count == 2
    world.clock.advance(minutes=6)  # past the warning window and the reclaim grace
    store = SlowBatchReads(world, seconds=40)
    world.rewire(store=store)

    # room for one batch before the reserve: the gang's job, updated last, is among those deferred
    report = world.reconciler.run(deadline=world.clock.now() + REPAIR_RESERVE + timedelta(seconds=10))

    assert report.repairs[Repair.RUNNING_REPAIRS_DEFERRED_TO_THE_NEXT_RUN] == 101
    assert report.repairs[Repair.RECLAIMED_SURVIVORS_TERMINATED] == 1
    assert world.compute.instances[gang.instance_ids[1]].state == "terminated"
    live_replacement = [world.compute.instances[i].state for i in replaced.instance_ids]
    assert live_replacement == ["running", "running"]
