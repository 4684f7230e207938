"""Ray's dashboard agent for rayaug's own local node, loading only what Ray's minimal install
loads: `python -m rayaug.minimal_agent AGENT_SCRIPT ARGS...` runs Ray's `dashboard/agent.py`.

The raylet waits for its agent's ports before it registers, and so before the driver connects
and the workers start. Ray's agent imports every dashboard module it can and starts each one.
rayaug installs `ray[default]` (the Jobs API client of `rayaug submit`), so all of them import:
half a second of imports, then seven modules (logs, events, jobs, health, the metrics
reporter) serving a dashboard this node does not run. In Ray's minimal install (`pip install
ray`) the agent starts only the modules marked minimal, and Ray 2.60 marks none
(`tests/test_minimal_agent.py` checks the installed Ray): so none here either.
"""

from __future__ import annotations

import runpy
import sys


def main() -> None:
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
