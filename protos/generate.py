"""Regenerate the Python code of Tandem's contracts: `python protos/generate.py`.

protoc writes imports relative to the proto root (`from tandem.common.v1 import ...`), but
the generated package lives under `protos.` so that it never shadows the `tandem` kernel
package; the imports are rewritten accordingly. Generated files are committed and never
edited by hand; tests/unit/protos/test_contracts.py fails when they are stale.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent
_IMPORT = re.compile(r"^from tandem\.", re.MULTILINE)


def proto_files() -> list[Path]:
    return sorted(ROOT.glob("tandem/*/v1/*.proto"))


def generate(out_dir: Path = ROOT) -> list[Path]:
    """Run protoc into out_dir and rewrite imports; returns the generated files."""
    files = [str(p.relative_to(ROOT)) for p in proto_files()]
    args = ["protoc", f"-I{ROOT}", f"--python_out={out_dir}", f"--pyi_out={out_dir}",
            f"--grpc_python_out={out_dir}", *files]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    generated = sorted(out_dir.glob("tandem/*/v1/*_pb2*.py*"))
    for path in generated:
        text = path.read_text()
        path.write_text(_IMPORT.sub("from protos.tandem.", text))
    for package in {out_dir / "tandem", *(p.parent for p in generated), *(p.parent.parent for p in generated)}:
        (package / "__init__.py").touch()
    return generated


if __name__ == "__main__":
    for path in generate(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT):
        print(path)
