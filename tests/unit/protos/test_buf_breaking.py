"""`buf breaking` on the contracts: the protos as they are against themselves is clean, and a
planted breaking change (a field's type changed, a field removed) is caught."""

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


@pytest.fixture
def baseline(tmp_path) -> Path:
    """An image of the protos as committed in this tree (what buf breaking compares against)."""
    image = tmp_path / "baseline.binpb"
    result = subprocess.run([_buf(), "build", "-o", str(image)], cwd=PROTOS, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return image


def _copy(tmp_path: Path) -> Path:
    copy = tmp_path / "protos"
    shutil.copytree(PROTOS, copy, ignore=shutil.ignore_patterns("*.py", "*.pyi", "__pycache__"))
    return copy


def test_buf_breaking_is_clean_against_the_baseline(baseline, tmp_path):
    result = subprocess.run([_buf(), "breaking", "--against", str(baseline)], cwd=_copy(tmp_path),
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_buf_breaking_catches_a_changed_field_type(baseline, tmp_path):
    copy = _copy(tmp_path)
    proto = copy / "tandem/reward/v1/reward.proto"
    text = proto.read_text()
    planted = text.replace("  string task = 1;", "  bytes task = 1;", 1)
    assert planted != text
    proto.write_text(planted)
    result = subprocess.run([_buf(), "breaking", "--against", str(baseline)], cwd=copy, capture_output=True, text=True)
    assert result.returncode != 0 and "ScoreItem" in result.stdout, result.stdout + result.stderr
