"""Ray's dashboard agent for rayaug's own local node, loading only what Ray's minimal install
loads: `python minimal_agent.py AGENT_SCRIPT ARGS...` runs Ray's `dashboard/agent.py` with ARGS.

The raylet waits for its agent's ports before it registers, and so before the driver connects
and the workers start. Ray's agent imports every dashboard module it can and starts each one.
rayaug installs `ray[default]` (for `rayaug submit`'s Jobs API client), so all of them import:
half a second of imports, then seven modules (logs, events, jobs, health, the metrics
reporter) serving a dashboard this node does not run. In Ray's minimal install (`pip install
ray`) the agent starts only the modules marked minimal, and Ray 2.60 marks none
(`tests/test_minimal_agent.py` checks the installed Ray): so none here either.

The node runs this file by its path (`command`), not as `-m rayaug.minimal_agent`: the agent
does not get the driver's sys.path, as Ray's workers do, so rayaug may not be importable there.
"""

from __future__ import annotations

import os
import runpy
import sys


def command() -> list[str]:
    """What follows the Python executable (and its flags) to start the agent through here."""
    return [os.path.abspath(__file__)]


def main() -> None:
    # A script run by its path has its folder first on sys.path, where rayaug's module names
    # (`spec`, `storage`, `records`...) would shadow any of the same name the agent imports.
    if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
        del sys.path[0]
    from ray.dashboard import utils

    utils.get_all_modules = minimal_modules
    script, *args = sys.argv[1:]
    sys.argv = [script, *args]
    runpy.run_path(script, run_name="__main__")


def minimal_modules(module_type: type) -> list[type]:
    """The agent modules of Ray's minimal install (none in Ray 2.60), without importing the
    others."""
    return []


if __name__ == "__main__":
    main()
