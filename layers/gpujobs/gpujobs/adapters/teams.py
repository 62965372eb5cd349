"""The team configuration from the SSM parameter the stack names (`TeamsParameterName`).

A parameter rather than a stack parameter: the platform team changes who may act for which team
without redeploying the stack, SSM keeps every version with who wrote it, and write access to it is
granted apart from the stack's. Read once per Lambda container (`JobService.team_directory`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from types_boto3_ssm import SSMClient

    from gpujobs.domain.teams import TeamDirectory


class SsmTeamConfig:
    def __init__(self, *, client: SSMClient, parameter_name: str) -> None:
        self._ssm = client
        self._name = parameter_name

    def load(self) -> TeamDirectory:
        from gpujobs.domain.teams import parse_team_config  # the first submission's or launch's, not the cold start's

        value = self._ssm.get_parameter(Name=self._name)["Parameter"]["Value"]
        return parse_team_config(value)
