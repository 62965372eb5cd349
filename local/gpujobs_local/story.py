"""How the local walk-throughs talk to a person: a `Story` told as it happens, or one JSON summary.

Two commands narrate what they do: `gpujobs local demo` (`demo.Demo`: a job survives a spot
interruption on the local cloud) and `gpujobs local tour` (`tour.Tour`: the control plane alone on
an in-process moto). Both print timestamped steps as they happen, or, with `--json`, nothing but the
summary at the end. `MetricLineFilter` keeps the Lambda handlers' metric lines out of what they print.
"""

from __future__ import annotations

import argparse
import time
from typing import TextIO


class Story:
    """Steps stamped with the seconds since the story began, and plain lines under them.

    `out` None tells nothing (the JSON summary is the output); `spaced` puts a blank line before
    each step, for stories whose steps are chapters.
    """

    def __init__(self, *, out: TextIO | None, spaced: bool = False) -> None:
        self.out = out
        self.spaced = spaced
        self.started = time.monotonic()

    def elapsed(self) -> float:
        """Seconds since the story began."""
        return time.monotonic() - self.started

    def step(self, text: str) -> None:
        gap = "\n" if self.spaced else ""
        self.say(f"{gap}[{self.elapsed():5.1f}s] {text}")

    def say(self, text: str = "") -> None:
        if self.out is not None:
            print(text, file=self.out, flush=True)


def story_parser(*, prog: str, description: str | None) -> argparse.ArgumentParser:
    """The command line every walk-through takes: its own options plus `--json`."""
    parser = argparse.ArgumentParser(
        prog=prog, description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--json", action="store_true", help="print one JSON summary object instead of the story")
    return parser


class MetricLineFilter:
    """stdout minus Powertools' EMF lines (its cold-start metric prints even with metrics disabled)."""

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self._dropped = False

    def write(self, text: str) -> int:
        if text.startswith('{"_aws"'):
            self._dropped = True
            return len(text)
        if self._dropped and text == "\n":
            self._dropped = False
            return len(text)
        self._dropped = False
        return self._out.write(text)

    def flush(self) -> None:
        self._out.flush()

    def __getattr__(self, name: str) -> object:
        return getattr(self._out, name)
