"""GPU metrics from the CloudWatch agent, which the idle alarms watch.

The agent ships with the GPU AMIs; where it is missing, or fails to start, training goes on without
the metrics (best effort).
"""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

from gpujobs.instance.log import log

CW_AGENT_CTL = "/opt/aws/amazon-cloudwatch-agent/bin/amazon-cloudwatch-agent-ctl"
CW_AGENT_CONFIG = "/opt/aws/amazon-cloudwatch-agent/etc/gpujobs-gpu.json"


def cloudwatch_agent_config() -> dict[str, Any]:
    """NVIDIA GPU metrics every 60 s in CWAgent, plus a per-instance series for idle alarms."""
    return {
        "agent": {"metrics_collection_interval": 60, "run_as_user": "root"},
        "metrics": {
            "namespace": "CWAgent",
            "append_dimensions": {"InstanceId": "${aws:InstanceId}"},
            "aggregation_dimensions": [["InstanceId"]],
            "metrics_collected": {
                "nvidia_gpu": {
                    "measurement": ["utilization_gpu", "utilization_memory", "memory_used"],
                    "metrics_collection_interval": 60,
                }
            },
        },
    }


def cloudwatch_agent_installed() -> bool:
    return os.path.exists(CW_AGENT_CTL)


def start_cloudwatch_agent() -> None:
    """Best effort: GPU metrics feed idle alarms, but missing them must not stop training."""
    try:
        with open(CW_AGENT_CONFIG, "w", encoding="utf-8") as f:
            json.dump(cloudwatch_agent_config(), f)
        argv = [CW_AGENT_CTL, "-a", "fetch-config", "-m", "ec2", "-s", "-c", "file:" + CW_AGENT_CONFIG]
        subprocess.run(argv, check=True, capture_output=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as exc:
        log(f"CloudWatch agent not started: {exc}")
