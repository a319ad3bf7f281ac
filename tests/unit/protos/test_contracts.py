"""The contracts: generated code is current, buf lint is clean and catches a planted error."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PROTOS = ROOT / "protos"


def _buf() -> str:
    buf = shutil.which("buf") or str(Path(sys.executable).parent / "buf")
    if not Path(buf).exists():
        pytest.fail("buf is not installed: run scripts/setup.sh (it installs buf-bin)")
    return buf


def test_generated_code_is_current(tmp_path):
    sys.path.insert(0, str(PROTOS))
    from generate import generate  # protos/generate.py

    for path in generate(tmp_path):
        committed = PROTOS / path.relative_to(tmp_path)
        assert committed.read_text() == path.read_text(), f"{committed} is stale: run python protos/generate.py"


def test_buf_lint_is_clean():
    result = subprocess.run([_buf(), "lint"], cwd=PROTOS, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_buf_lint_catches_a_planted_error(tmp_path):
    copy = tmp_path / "protos"
    shutil.copytree(PROTOS, copy, ignore=shutil.ignore_patterns("*.py", "*.pyi", "__pycache__"))
    reward = copy / "tandem/reward/v1/reward.proto"
    reward.write_text(reward.read_text().replace("message ScoreItem {", "message score_item {")
                      .replace("repeated ScoreItem items", "repeated score_item items"))
    result = subprocess.run([_buf(), "lint"], cwd=copy, capture_output=True, text=True)
    assert result.returncode != 0 and "score_item" in result.stdout
