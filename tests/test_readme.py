"""The README's code example runs and prints what the README says it prints."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_why_example_prints_documented_values():
    pytest.importorskip("torch")
    text = README.read_text()
    block = re.search(r"## Why.*?```python\n(.*?)```", text, re.S).group(1)
    expected = re.findall(r"# (tensor\([^)]*\).*)$", block, re.M)
    out = subprocess.run([sys.executable, "-c", block], capture_output=True, text=True, check=True)
    lines = out.stdout.strip().splitlines()
    assert lines[0] == expected[0].split(":")[0].strip()
    assert lines[1] == "tensor(0.) True"
