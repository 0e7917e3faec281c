"""The README's Python quick start runs as written: probe, load, govern, fit (real TensorFlow).

Run in a new process in an empty folder, so its profile lands in that folder's device_profiles/
(the default place) and not in the repository's.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def quick_start_code() -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert len(blocks) == 1, "the README has one Python block: the quick start"
    return blocks[0]


def test_the_quick_start_is_about_ten_lines_and_uses_the_public_api():
    code = quick_start_code()
    assert len(code.strip().splitlines()) <= 14
    for call in ("edgebatch.probe(", "edgebatch.cached_profile(", "edgebatch.Governor.from_profile(", "edgebatch.fit("):
        assert call in code


@pytest.mark.slow
def test_the_quick_start_runs_as_written(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "EDGEBATCH_PROFILES"}
    done = subprocess.run([sys.executable, "-c", quick_start_code()], cwd=tmp_path, capture_output=True, text=True,
                          timeout=900, env={**env, "KERAS_HOME": str(tmp_path / ".keras")})
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.search(r"safe batch \d+; 4096 examples in \d+ updates", done.stdout), done.stdout[-2000:]
    assert len(list((tmp_path / "device_profiles").glob("*.json"))) == 1
