"""The local cloud's SSM agent runs the signal document as EC2's would: SIGUSR1 (checkpoint now) by
default, SIGUSR2 (a hung gang's stack dump) when the command says so, and nothing the document's
allowedPattern would refuse."""

from __future__ import annotations

import signal
from typing import Any

from gpujobs_local.ssm_agent import LocalSsmAgent

DOCUMENT = "gpujobs-checkpoint-now"


class Runner:
    def __init__(self) -> None:
        self.signals: list[tuple[str, int]] = []

    def signal_container(self, instance_id: str, signum: int) -> bool:
        self.signals.append((instance_id, signum))
        return True


class Ssm:
    def __init__(self, *commands: dict[str, Any]) -> None:
        self.commands = list(commands)

    def list_commands(self, **_: Any) -> dict[str, Any]:
        return {"Commands": self.commands}


def command(command_id: str, instance_id: str, **parameters: list[str]) -> dict[str, Any]:
    container = {"containerName": ["gpujobs-j-0123456789abcdef-a1"]}
    return {
        "CommandId": command_id,
        "DocumentName": DOCUMENT,
        "InstanceIds": [instance_id],
        "Parameters": {**container, **parameters},
    }


def test_each_command_delivers_its_own_signal_and_a_refused_one_none() -> None:
    runner = Runner()
    ssm = Ssm(
        command("c-1", "i-checkpoint"),
        command("c-2", "i-hung", signal=["SIGUSR2"]),
        command("c-3", "i-other", signal=["SIGKILL"]),
    )

    LocalSsmAgent(ssm=ssm, runner=runner, document_name=DOCUMENT).poll()  # type: ignore[arg-type]

    assert runner.signals == [("i-checkpoint", signal.SIGUSR1), ("i-hung", signal.SIGUSR2)]
