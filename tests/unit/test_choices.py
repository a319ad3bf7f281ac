"""A choice made at config load is an object, never re-branched downstream: the objects answer
what callers ask (Launch, DatasetName and its data sources, ServicePlan, ServiceKind), and no
project module compares one of these choices with a string (a grep, shown to catch a planted case)."""

import re
from pathlib import Path

import pytest

from coordinator.config import load_config
from coordinator.config.data import DatasetName
from coordinator.config.experiment import ServicePlan
from coordinator.config.run import Launch
from coordinator.data.sources import SOURCES, EmbeddedSource, UserFiles

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("coordinator", "trainer_svc", "generator_svc", "reward_svc", "tandem")
CHOICES = r"\b(?:launch|dataset_name|backend|kind)\b"
STRING_COMPARISONS = re.compile(rf"{CHOICES}\s*[!=]=\s*[rbf]?['\"]"  # kind == "reward"
                                rf"|['\"]\s*[!=]=\s*[\w.]*{CHOICES}"  # "reward" == kind
                                rf"|{CHOICES}\s+(?:not\s+)?in\s+[(\[{{]\s*[rbf]?['\"]"  # launch in ("local", ...)
                                # set as a string where nothing validates it: model_copy(update={"launch": "local"})
                                rf"|model_copy\(update=\{{[^}}]*['\"]{CHOICES}['\"]\s*:\s*[rbf]?['\"]")


def string_comparisons(root: Path) -> list[tuple[str, int, str]]:
    """(file, line, text) of every line of the packages' modules comparing a choice with a string."""
    found = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            if "_pb2" in path.name:
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if STRING_COMPARISONS.search(line):
                    found.append((str(path.relative_to(root)), number, line.strip()))
    return found


def test_no_choice_made_at_load_is_compared_with_a_string_downstream():
    found = string_comparisons(ROOT)
    assert [f"{path}:{number}: {text}" for path, number, text in found] == [], (
        "ask the choice's object (config/run.py Launch, config/data.py DatasetName, data/sources.py, "
        "tandem/kinds.py ServiceKind, trainer_svc TrainingBackend) instead")


@pytest.mark.parametrize("line", ['if member.kind == "reward":', "if cfg.cluster.launch != 'local':",
                                  'x = data.dataset_name in ("jsonl", "local")', 'if "megatron" == policy.backend:',
                                  'ok = backend not in ["dtensor"]',
                                  'cfg = cfg.model_copy(update={"port": 0, "launch": "local"})'])
def test_the_grep_catches_a_planted_comparison(tmp_path, line):
    for package in PACKAGES:
        (tmp_path / package).mkdir()
    (tmp_path / "tandem" / "planted.py").write_text(f'"""A planted comparison."""\n\n{line}\n')
    assert string_comparisons(tmp_path) == [("tandem/planted.py", 3, line)]


def test_the_grep_leaves_enum_comparisons_and_other_names_alone(tmp_path):
    for package in PACKAGES:
        (tmp_path / package).mkdir()
    (tmp_path / "tandem" / "fine.py").write_text('if kind is ServiceKind.REWARD and settings.distributed_executor_'
                                                 'backend == "uni":\n    pass\n')
    assert string_comparisons(tmp_path) == []


def test_the_launch_says_who_starts_and_who_dismisses_the_services():
    local, external = (load_config(None, [f"cluster.launch={name}"]).cluster.launch for name in ("local", "external"))
    assert local is Launch.LOCAL and local.starts_services and not local.dismisses_services
    assert external is Launch.EXTERNAL and not external.starts_services and external.dismisses_services
    assert (local.startup, external.startup) == ("starting", "waiting for") and f"{external}" == "external"


def test_every_dataset_name_has_a_source_that_knows_its_rows():
    assert set(SOURCES) == set(DatasetName)
    for name, source in SOURCES.items():
        assert isinstance(source, UserFiles if name.from_files else EmbeddedSource)
    assert [n for n in DatasetName if n.holds_pairs] == [DatasetName.ARITHMETIC_PREFERENCE, DatasetName.JSONL]
    assert [n for n in DatasetName if not n.holds_prompts] == [DatasetName.ARITHMETIC_PREFERENCE]
    assert [n for n, s in SOURCES.items() if s.uniform_prompts] == [DatasetName.ARITHMETIC]


def test_a_user_file_source_reads_its_jsonl_rows(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text('{"prompt": "1+1=", "answer": "2"}\n\n{"prompt": "2+2=", "answer": "4"}\n')
    cfg = load_config(None, ["data.dataset_name=jsonl", f"data.train_path={path}"])
    source = SOURCES[cfg.data.dataset_name]
    assert source.files(cfg.data) == (path, None)
    assert [row["answer"] for row in source.rows(path, "train")] == ["2", "4"]


@pytest.mark.parametrize(("overrides", "plan"), [
    ([], ServicePlan(1, 1, ("arithmetic",))),
    (["cluster.num_generators=3"], ServicePlan(3, 3, ("arithmetic",))),
    (["policy.megatron_cfg.enabled=true", "policy.dtensor_cfg.enabled=false", "policy.generation.backend=megatron"],
     ServicePlan(0, 1, ("arithmetic",))),
    (["data.dataset_name=arithmetic_preference", "cluster.num_generators=2"], ServicePlan(0, 0, ())),
])
def test_the_service_plan_follows_from_the_algorithm_and_the_generation_backend(overrides, plan):
    raw = {"dpo": {}} if "data.dataset_name=arithmetic_preference" in overrides else None  # a dpo run
    assert load_config(None, overrides, raw=raw).service_plan == plan
