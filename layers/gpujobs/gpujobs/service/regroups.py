"""A regroup's launch: one replacement for each reclaimed node, into the gang's own pool.

`domain.regroup` decides; this carries out the launch it asks for. The replacement goes where the
survivors are: the attempt's instance type, subnet and market, its placement group and the job's
security group, with the attempt's own run document and the next generation's tag. There is no
ladder: a gang cannot span zones, so a pool without room means the whole gang is replaced instead
(`domain.regroup.no_room`, whose launch walks the usual ladder). Never twice: the client token is the
attempt's and the generation's, and a replacement an earlier launcher started is adopted, not
launched again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpujobs.domain.gangs import placement_group_of
from gpujobs.domain.hardware import efa_interfaces
from gpujobs.domain.job import Attempt, Job, LaunchTry, Regroup
from gpujobs.domain.regroup import no_room, pending_regroup, record_replacement
from gpujobs.service.ports import (
    CapacityError,
    LaunchedInstance,
    LaunchRejectedError,
    LaunchRequest,
    LaunchTokenMismatchError,
)

if TYPE_CHECKING:
    from gpujobs.service.launcher import Launcher

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Regrouper:
    launcher: Launcher
    """For its ports, its configuration, its one write path and the attempt's run document."""

    def launch(self, job: Job, *, held: str | None) -> Job:
        """Launch the pending regroup's replacements (`held`: why the budget holds launches now)."""
        regroup, attempt = pending_regroup(job), job.current_attempt
        if regroup is None or attempt is None:
            return job
        if held is not None:
            return self._no_room(job, attempt, regroup, (), f"launches are held: {held}")
        compute = self.launcher.ports.compute
        adopted = self._started_before(job, attempt, regroup)
        if adopted:
            return self._record(job, attempt, regroup, adopted)
        subnet = next((s for s in compute.subnets() if s.subnet_id == attempt.subnet_id), None)
        if subnet is None or attempt.instance_type is None or attempt.market is None:
            return self._no_room(job, attempt, regroup, (), "its subnet is no longer one of the stack's")
        spec = job.require_spec()
        request = LaunchRequest(
            job_id=job.job_id,
            attempt=attempt.number,
            team=spec.team,
            name=spec.name,
            count=len(regroup.lost),
            instance_type=attempt.instance_type,
            subnet=subnet,
            market=attempt.market,
            client_token=f"{job.job_id}-a{attempt.number}-g{regroup.generation}",
            user_data=self.launcher.user_data(job, attempt),
            placement_group=placement_group_of(job, attempt),
            security_group_id=compute.job_security_group(job.job_id),
            efa_interfaces=efa_interfaces(
                self.launcher.config.hardware, instance_type=attempt.instance_type, nodes=spec.nodes
            ),
            generation=regroup.generation,
        )
        try:
            launched = compute.run_instances(request)
        except (CapacityError, LaunchRejectedError, LaunchTokenMismatchError) as exc:
            adopted = self._started_before(job, attempt, regroup)
            if adopted:  # a token mismatch: an earlier launcher's replacement is there
                return self._record(job, attempt, regroup, adopted)
            now = self.launcher.ports.clock.now()
            refused = LaunchTry(
                at=now,
                instance_type=request.instance_type,
                zone=subnet.zone,
                subnet_id=subnet.subnet_id,
                market=request.market,
                error_code=exc.code,
                message=exc.message,
            )
            return self._no_room(job, attempt, regroup, (refused,), exc.code)
        return self._record(job, attempt, regroup, launched)

    def _started_before(self, job: Job, attempt: Attempt, regroup: Regroup) -> list[LaunchedInstance]:
        """The generation's replacements an earlier launch of this regroup started, when all are there."""
        found = self.launcher.ports.compute.find_instances(job_id=job.job_id, attempt=attempt.number)
        known = {*attempt.instance_ids, *attempt.left}
        started = [i for i in found if i.generation == regroup.generation and i.instance_id not in known]
        return started if len(started) >= len(regroup.lost) else []

    def _record(self, job: Job, attempt: Attempt, regroup: Regroup, launched: list[LaunchedInstance]) -> Job:
        ids = tuple(i.instance_id for i in sorted(launched, key=lambda i: (i.launch_index, i.instance_id)))
        writes, clock = self.launcher.jobs, self.launcher.ports.clock
        applied = writes.change(
            job.job_id,
            lambda current: record_replacement(
                current, attempt_number=attempt.number, generation=regroup.generation, instance_ids=ids, now=clock.now()
            ),
        )
        return writes.act(applied)

    def _no_room(self, job: Job, attempt: Attempt, regroup: Regroup, tries: tuple[LaunchTry, ...], detail: str) -> Job:
        log.info("%s: no replacement for %s (%s): the whole gang is replaced", job.job_id, regroup.lost, detail)
        writes, clock = self.launcher.jobs, self.launcher.ports.clock
        applied = writes.change(
            job.job_id,
            lambda current: no_room(
                current,
                attempt_number=attempt.number,
                generation=regroup.generation,
                tries=tries,
                detail=detail,
                now=clock.now(),
            ),
        )
        return writes.act(applied)
