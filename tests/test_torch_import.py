"""``import stateremat.torch`` stays light: torch._dynamo is loaded only once compile is in use."""
from __future__ import annotations

import subprocess
import sys


def test_import_does_not_load_dynamo():
    code = ("import sys, stateremat.torch\n"
            "assert 'torch._dynamo' not in sys.modules, 'stateremat.torch imported torch._dynamo'\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
