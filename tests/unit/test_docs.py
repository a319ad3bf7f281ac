"""The documentation: the MkDocs site builds with --strict, docs/configuration.md is what
docs/gen_config.py makes of the schema today, and every repository path cited in docs/*.md,
README.md and the comments and docstrings of the project's Python files exists."""

from __future__ import annotations

import ast
import importlib.util
import io
import os
import re
import shutil
import subprocess
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOP = ("coordinator", "trainer_svc", "generator_svc", "reward_svc", "tandem", "protos", "tests", "benchmarks",
       "docs", "scripts", "docker", "deploy", "examples", "requirements")
# A cited path: a top-level folder of the repository and at least one more component, optionally
# `:name` (a function, class or constant of that file). Not part of a longer path or name
# (`~/.cache/tandem`, `localhost/tandem:cpu`, `$HF_HOME/tandem`), and no placeholder (`tests/<x>`).
CITATION = re.compile(rf"(?<![\w./~$<>@-])(?P<path>(?:{'|'.join(TOP)})(?:/[\w.-]+)+/?)"
                      r"(?::(?P<name>[A-Za-z_][\w.]*))?(?P<glob>\*)?")


def citations(text: str) -> list[tuple[str, str | None, bool]]:
    """(path, name or None, whether the path is a glob's prefix) of each path cited in text."""
    found = []
    for match in CITATION.finditer(text):
        name = match["name"].rstrip(".") if match["name"] else None
        found.append((match["path"].rstrip("."), name, bool(match["glob"])))
    return found


def dangling(path: str, name: str | None, glob: bool, root: Path = ROOT) -> str | None:
    """Why a citation points nowhere, or None when it holds."""
    if glob:
        return None if any(root.glob(path + "*")) else "no file matches"
    target = root / path
    if not target.exists():
        return "no such file"
    if name and target.is_file():
        source = target.read_text(errors="replace")
        for part in name.split("."):
            pattern = rf"^\s*(?:async\s+def|def|class)\s+{re.escape(part)}\b|^\s*{re.escape(part)}\s*[:=]"
            if not re.search(pattern, source, flags=re.MULTILINE):
                return f"{part} is not defined there"
    return None


def python_prose(source: str) -> list[tuple[int, str]]:
    """(line, text) of the comments and of the string statements (docstrings, attribute docstrings)."""
    prose = [(tok.start[0], tok.string) for tok in tokenize.generate_tokens(io.StringIO(source).readline)
             if tok.type == tokenize.COMMENT]
    prose += [(node.lineno, node.value.value) for node in ast.walk(ast.parse(source))
              if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
              and isinstance(node.value.value, str)]
    return prose


def _python_files() -> list[Path]:
    files = list(ROOT.glob("*.py"))
    for top in TOP:
        files += [path for path in (ROOT / top).rglob("*.py")
                  if "_pb2" not in path.name and "__pycache__" not in path.parts]
    return sorted(files)


def _missing(text: str, where: str) -> list[str]:
    return [f"{where}: {path}{':' + name if name else ''} ({why})" for path, name, glob in citations(text)
            if (why := dangling(path, name, glob))]


def test_every_cited_path_exists():
    missing = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
                 *sorted((ROOT / "benchmarks" / "results").glob("*.md"))]:
        missing += _missing(page.read_text(), str(page.relative_to(ROOT)))
    for path in _python_files():
        for line, text in python_prose(path.read_text()):
            missing += _missing(text, f"{path.relative_to(ROOT)}:{line}")
    assert not missing, "cited paths that do not exist (fix the citation):\n" + "\n".join(missing)


def test_the_citation_check_finds_a_planted_bad_path():
    text = ('"""See coordinator/loop/pipeline.py, coordinator/loop/pipeline.py:RolloutPipeline, '
            'tests/integration/test_fuzz_*.py and tests/slurm/."""\n'
            '# Moved: coordinator/resume.py, and coordinator/loop/pipeline.py:no_such_function.\n'
            'x = "coordinator/in_code_not_prose.py"\n')
    found = [(path, name) for _, prose in python_prose(text) for path, name, glob in citations(prose)
             if dangling(path, name, glob)]
    assert found == [("coordinator/resume.py", None), ("coordinator/loop/pipeline.py", "no_such_function")]
    assert citations("~/.cache/tandem/x localhost/tandem:cpu $HF_HOME/tandem/y tests/<name>.py") == []


def _gen_config():
    spec = importlib.util.spec_from_file_location("gen_config", ROOT / "docs" / "gen_config.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_configuration_page_matches_the_schema():
    gen = _gen_config()
    assert gen.PAGE.read_text() == gen.render(), "docs/configuration.md is stale: run python docs/gen_config.py"


def test_every_key_of_the_schema_says_what_it_means():
    """A key without a docstring under its field shows an empty meaning on the configuration page."""
    undocumented = [line.split("|")[1].strip() for line in _gen_config().render().splitlines()
                    if line.startswith("| `") and line.rstrip().endswith("|  |")]
    assert undocumented == [], "write a docstring under these fields: " + ", ".join(undocumented)


def test_the_site_builds_strictly(tmp_path):
    """A copy of docs/ with the configuration page regenerated, built as mkdocs.yml says, warnings
    (a broken link or anchor, a page missing from the nav) failing the build."""
    docs = tmp_path / "docs"
    shutil.copytree(ROOT / "docs", docs)
    (docs / "configuration.md").write_text(_gen_config().render())
    config = (ROOT / "mkdocs.yml").read_text()
    assert "\ndocs_dir: docs\n" in config
    (tmp_path / "mkdocs.yml").write_text(config.replace("\ndocs_dir: docs\n", f"\ndocs_dir: {docs}\n"))
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                           str(tmp_path / "mkdocs.yml"), "--site-dir", str(tmp_path / "site")],
                          check=False, capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "site" / "architecture" / "index.html").exists()


def test_the_readme_stays_a_front_page():
    """README.md is what Tandem is, the two commands, an example, the features and where to read on;
    the rest lives in docs/ and measured figures in benchmarks/results/."""
    readme = (ROOT / "README.md").read_text()
    assert readme.count("\n") <= 300, "README.md is over 300 lines: move the details into docs/"
    for command in ("bash scripts/setup.sh && .venv/bin/tandem run",
                    "bash scripts/setup.sh && .venv/bin/python -m pytest -q"):
        assert command in readme
