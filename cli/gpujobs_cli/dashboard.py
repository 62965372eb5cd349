"""`gpujobs dashboard`: the console URL of the stack's CloudWatch dashboard."""

from __future__ import annotations

import argparse
import json
from urllib.parse import quote

from gpujobs_cli.resources import DASHBOARD, discover

EXIT_OK = 0


def cmd_dashboard(args: argparse.Namespace) -> int:
    """The stack's CloudWatch dashboard: its name from the stack output (or GPUJOBS_DASHBOARD)."""
    resources = discover(stack=args.stack, region=args.region, needs=(DASHBOARD,))
    name, region = resources.values[DASHBOARD], resources.region_name
    url = dashboard_url(name, region)
    print(json.dumps({"dashboard": name, "region": region, "url": url}, indent=2) if args.json else url)
    return EXIT_OK


def dashboard_url(name: str, region: str) -> str:
    """The console page of dashboard `name` (the console's domain differs in China and GovCloud)."""
    if region.startswith("cn-"):
        host = f"{region}.console.amazonaws.cn"
    elif region.startswith("us-gov-"):
        host = "console.amazonaws-us-gov.com"
    else:
        host = f"{region}.console.aws.amazon.com"
    return f"https://{host}/cloudwatch/home?region={region}#dashboards/dashboard/{quote(name, safe='')}"
