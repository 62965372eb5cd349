"""Checks of the training command before torchrun starts it: a program or script that is not there.

torchrun hides why its workers failed: a worker that cannot open its script exits 2, and torchrun
exits 1, which reads as a crash, so the job would be retried until its attempts run out. Checked
here first, the same mistake exits 78 (a configuration error, which the control plane fails at once)
with the line the shell or Python would have printed, which the exit report carries to
`gpujobs status`. Only what is certain is checked: a missing program, and the script of a
`python SCRIPT` command; `python -m`, `python -c` and anything else are left to run.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path

_PYTHON_OPTIONS_WITH_VALUE = frozenset({"-W", "-X", "--check-hash-based-pycs"})


def command_problem(command: Sequence[str]) -> str | None:
    """Why `command` cannot start, in the words a shell or Python uses; None when it may."""
    program = command[0]
    if "/" in program:
        if not Path(program).is_file():
            return f"{program}: No such file or directory"
        if not os.access(program, os.X_OK):
            return f"{program}: Permission denied"
    elif shutil.which(program) is None:
        return f"{program}: command not found"
    if not Path(program).name.startswith("python"):
        return None
    script = _python_script(command[1:])
    if script is not None and not Path(script).is_file():
        return f"{program}: can't open file {str(Path(script).absolute())!r}: [Errno 2] No such file or directory"
    return None


def _python_script(args: Sequence[str]) -> str | None:
    """The script a `python [options] SCRIPT ...` command runs; None for `-m`, `-c` or stdin."""
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg in ("-m", "-c", "-"):
            return None
        elif arg in _PYTHON_OPTIONS_WITH_VALUE:
            skip = True
        elif not arg.startswith("-"):
            return arg
    return None
