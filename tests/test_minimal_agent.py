"""The dashboard agent of rayaug's own local node loads what Ray's minimal install loads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from ray.dashboard import utils as dashboard_utils

from rayaug import minimal_agent

# What the stand-in script reports: its arguments, name, sys.path and modules, the agent's modules.
AGENT_SCRIPT = """
import json, sys
from ray.dashboard import utils
print(json.dumps({
    "argv": sys.argv,
    "name": __name__,
    "modules": utils.get_all_modules(object),
    "path": sys.path,
    "rayaug imported": "rayaug" in sys.modules,
}))
"""


def test_the_agent_loads_exactly_the_modules_of_rays_minimal_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ray's own choice where the dashboard's dependencies are missing (the modules marked
    minimal) is the stand-in's: none in the Ray installed. With them installed, as here, Ray
    would start several, which is what the stand-in leaves out."""
    module_type = dashboard_utils.DashboardAgentModule
    every_module = dashboard_utils.get_all_modules(module_type)
    monkeypatch.setattr(
        dashboard_utils, "get_dashboard_dependency_error", lambda: ImportError("minimal install")
    )
    minimal = dashboard_utils.get_all_modules(module_type)
    assert minimal == minimal_agent.minimal_modules(module_type)
    assert len(every_module) > len(minimal)


def test_runs_the_agent_script_with_its_arguments_without_importing_rayaug(tmp_path: Path) -> None:
    """The node's command (`python -u` + `command()` + SCRIPT ARGS...) runs SCRIPT as the main
    module with ARGS, as `python SCRIPT ARGS...` would, the module loading replaced. It does not
    import rayaug (the agent does not get the driver's sys.path, where rayaug may be), and
    rayaug's folder is not on the path, where its module names would shadow others'."""
    script = tmp_path / "agent.py"
    script.write_text(AGENT_SCRIPT)
    argv = [sys.executable, "-u", *minimal_agent.command(), str(script), "--node-id=ab", "x"]
    environment = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=60, check=True, cwd=tmp_path, env=environment
    )
    report = json.loads(done.stdout)
    assert report["argv"] == [str(script), "--node-id=ab", "x"]
    assert (report["name"], report["modules"], report["rayaug imported"]) == ("__main__", [], False)
    assert str(Path(minimal_agent.__file__).parent) not in report["path"]
