"""The bench lab's probes (bench/lab/, not installed with the package), imported the way
`python bench/lab/<probe>.py` sees them: by module name, with their folder on sys.path
(spawned worker processes inherit the path, so a probe's process targets import too)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

LAB = Path(__file__).resolve().parents[1] / "bench" / "lab"


def lab_module(name: str) -> ModuleType:
    """The lab module bench/lab/<name>.py."""
    if str(LAB) not in sys.path:
        sys.path.append(str(LAB))
    return importlib.import_module(name)
