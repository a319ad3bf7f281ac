"""The checks made before a run starts anything (coordinator/preflight/: machine.py, model_files.py,
data.py, lengths.py; coordinator/data/examples.py, config/loading.py), and the cause line of a dead service's
log (coordinator/launch/log_cause.py), on files made here."""

import json
import struct
from pathlib import Path

import pytest

from coordinator.config import ConfigError, load_config
from coordinator.data.examples import Example, read_examples
from coordinator.data.tokens import Tokens
from coordinator.embedded.tiny_model import build_char_tokenizer
from coordinator.launch.log_cause import cause_line
from coordinator.preflight.data import load_examples
from coordinator.preflight.lengths import check_lengths, measure_examples
from coordinator.preflight.machine import check_kv_cache_memory, check_machine, check_writable_dir
from coordinator.preflight.model_files import check_chat_template, check_model_dir


@pytest.fixture(scope="module")
def tokens() -> Tokens:
    return Tokens("the embedded model", build_char_tokenizer())


def _safetensors(path: Path, tensors: dict[str, tuple[list[int], int]], cut: int = 0) -> None:
    """A safetensors file of float32 tensors {name: (shape, byte count)}, minus `cut` trailing bytes."""
    header, offset = {}, 0
    for name, (shape, size) in tensors.items():
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header).encode()
    data = struct.pack("<Q", len(blob)) + blob + bytes(offset)
    path.write_bytes(data[:len(data) - cut])


@pytest.fixture
def model(tmp_path) -> Path:
    root = tmp_path / "model"
    root.mkdir()
    (root / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (root / "tokenizer.json").write_text("{}")
    _safetensors(root / "model.safetensors", {"w": ([2, 3], 24), "b": ([3], 12)})
    return root


def test_a_sound_model_directory_passes(model):
    check_model_dir(model)


@pytest.mark.parametrize("damage, message", [
    (lambda m: (m / "config.json").write_text("{bad"), r"config\.json is not valid JSON"),
    (lambda m: (m / "config.json").write_text("{}"), r"config\.json names no model_type"),
    (lambda m: (m / "config.json").write_bytes(b"\xff\xfe\x00"), r"config\.json is not valid JSON"),
    (lambda m: (m / "config.json").unlink(), r"config\.json is missing"),
    (lambda m: _safetensors(m / "model.safetensors", {"w": ([2, 3], 24)}, cut=5), r"tensor 'w' ends at byte 24"),
    (lambda m: (m / "model.safetensors").write_bytes(b"\x01\x02"), r"truncated \(2 bytes"),
    (lambda m: (m / "model.safetensors").write_bytes(struct.pack("<Q", 10**9) + b"{}"), r"header claims"),
    (lambda m: (m / "model.safetensors").write_bytes(struct.pack("<Q", 4) + b"nope"), r"corrupt safetensors header"),
    (lambda m: _safetensors(m / "model.safetensors", {"w": ([2, 3], 20)}), r"shape \[2, 3\] but 20 bytes"),
    (lambda m: (m / "model.safetensors").unlink(), r"holds no weights"),
    (lambda m: (m / "tokenizer.json").unlink(), r"holds no tokenizer"),
    (lambda m: (m / "tokenizer.json").write_text("x"), r"tokenizer\.json is not valid JSON"),
])
def test_a_damaged_model_directory_names_the_file_and_the_key(model, damage, message):
    damage(model)
    with pytest.raises(ConfigError, match=message) as caught:
        check_model_dir(model)
    assert str(caught.value).startswith("policy.model_name: ")


def test_an_agent_task_needs_a_chat_model_and_says_so_before_anything_starts(model):
    from coordinator.preflight.inputs import Preflight

    with pytest.raises(ConfigError, match="env.t.agent: .* has no chat template"):
        check_chat_template(model, "env.t.agent")
    (model / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"}))
    check_chat_template(model, "env.t.agent")
    (model / "tokenizer_config.json").write_text("{}")
    (model / "chat_template.jinja").write_text("{{ messages }}")
    check_chat_template(model, "env.t.agent")
    cfg = load_config(raw={"env": {"arithmetic": {"agent": {"function": f"{__name__}._agent"}}}})
    with pytest.raises(ConfigError, match="env.arithmetic.agent: agent tasks need a chat model .* embedded tiny"):
        Preflight(cfg).model()


async def _agent(example, client):
    return 0.0


def test_paths_the_run_writes_are_probed_and_nothing_is_left_behind(tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(ConfigError, match=r"logger\.log_dir: .* is a file"):
        check_writable_dir(a_file, "logger.log_dir")
    with pytest.raises(ConfigError, match=r"checkpointing\.checkpoint_dir: cannot create or write .*Not a directory"):
        check_writable_dir(a_file / "sub", "checkpointing.checkpoint_dir")
    check_writable_dir(tmp_path / "new" / "deeper", "logger.log_dir")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]  # the probe removed what it made
    cfg = load_config(overrides=[f"logger.log_dir={tmp_path}", f"checkpointing.checkpoint_dir={a_file}/ckpt"])
    with pytest.raises(ConfigError, match=r"checkpointing\.checkpoint_dir"):
        check_machine(cfg)


def test_kv_cache_beyond_the_memory_of_the_machine_is_refused(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       16000000 kB\nMemAvailable:    8000000 kB\n")
    check_kv_cache_memory(load_config(overrides=["policy.generation.vllm_cfg.kv_cache_space_gib=2"]), meminfo)
    cfg = load_config(overrides=["policy.generation.vllm_cfg.kv_cache_space_gib=4", "cluster.num_generators=2"])
    with pytest.raises(ConfigError, match=r"kv_cache_space_gib: 4 GiB x 2 generator\(s\) .* \(7\.6 GiB\)"):
        check_kv_cache_memory(cfg, meminfo)


@pytest.mark.parametrize("content, message", [
    (b"", r"holds no examples"),
    (b"\n \n\n", r"holds no examples"),
    (b'{"prompt": "1+1=", "answer": "2"}\n[1, 2]\n', r"d\.jsonl:2: a row must be a JSON object"),
    (b'{"prompt": "1+1=", "answer": "2"}\n{"prompt": \n', r"d\.jsonl:2: not a JSON object"),
    (b'{"prompt": null, "answer": "2"}\n', r"d\.jsonl: row 1 has no 'prompt'"),
    (b'{"prompt": {"a": 1}, "answer": "2"}\n', r"d\.jsonl: row 1: prompt must be a string or a list"),
    (b'{"prompt": "1+1=", "answer": [2]}\n', r"d\.jsonl: row 1: answer must be a string"),
    (b'{"prompt": "1+1=", "answer": "2", "task": ["a"]}\n', r"d\.jsonl: row 1: task must be a string"),
    (b'{"prompt": "1+1=", "answer": "2"}\n\x89PNG\r\n\x1a\n\xff\x00', r"d\.jsonl: not UTF-8 text"),
    (b'{"answer": "2"}\n', r"d\.jsonl: row 1 has no 'prompt'"),
])
def test_malformed_data_files_name_the_file_and_line(tmp_path, tokens, content, message):
    path = tmp_path / "d.jsonl"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=message) as caught:
        load_examples(path, load_config().data, tokens, "data.train_path", "train")
    assert str(caught.value).startswith("data.train_path: ")


def test_a_data_path_that_is_a_directory_or_missing_is_named(tmp_path, tokens):
    data = load_config(overrides=["data.dataset_name=jsonl", "data.train_path=x"]).data
    with pytest.raises(ValueError, match="is a directory"):
        read_examples(tmp_path, data, tokens)
    with pytest.raises(ValueError, match="does not exist"):
        read_examples(tmp_path / "nope.jsonl", data, tokens)
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b'\xef\xbb\xbf{"prompt": "1+1=", "answer": 2}\n')
    assert read_examples(bom, data, tokens)[0].answer == "2"  # a byte-order mark and a numeric answer are fine


def test_prompt_lengths_against_what_generators_and_the_trainer_take():
    examples = [Example("x" * n, "1", "arithmetic", tuple(range(n + 1))) for n in (5, 5, 5, 40)]
    cfg = load_config(overrides=["policy.generation.max_new_tokens=4"])  # max_model_len 64, max_total 64
    assert check_lengths(cfg, measure_examples(cfg, examples, "train")) is None
    cfg = load_config(overrides=["policy.generation.max_new_tokens=30"])
    with pytest.raises(ConfigError, match=r"1 of 4 prompts are too long for the generators.*at least 71"):
        check_lengths(cfg, measure_examples(cfg, examples, "train"))
    cfg = load_config(overrides=["policy.max_total_sequence_length=20",
                                 "policy.generation.vllm_cfg.max_model_len=64"])
    warning = check_lengths(cfg, measure_examples(cfg, examples, "train"))
    assert warning and "1 of 4 prompts (25%)" in warning and "at least 45" in warning
    cfg = load_config(overrides=["policy.max_total_sequence_length=4", "policy.generation.max_new_tokens=2",
                                 "policy.generation.vllm_cfg.max_model_len=64"])
    with pytest.raises(ConfigError, match=r"4 of 4 prompts \(100%\).*data\.max_truncated_fraction"):
        check_lengths(cfg, measure_examples(cfg, examples, "train"))


@pytest.mark.parametrize("override, message", [
    ("grpo.max_num_steps=[1", r"the value of grpo\.max_num_steps is not valid YAML"),
    ("grpo..max_num_steps=1", r"must look like section\.key=value"),
    ("logger.run_name=/abs", r"logger\.run_name: '/abs' is not a plain name"),
    ("logger.run_name=../up", r"logger\.run_name: '\.\./up' is not a plain name"),
    ("policy.generation.max_new_tokens=64", r"max_new_tokens \(64\) leaves no room for a prompt"),
])
def test_config_mistakes_name_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(overrides=[override])


def test_config_files_that_are_no_yaml_are_named(tmp_path):
    with pytest.raises(ConfigError, match="is a directory"):
        load_config(tmp_path)
    binary = tmp_path / "b.yaml"
    binary.write_bytes(b"\x00\xff\xfe\x89")
    with pytest.raises(ConfigError, match=r"b\.yaml is not UTF-8 text"):
        load_config(binary)


TORCHRUN_TAIL = """[rank0]: Traceback (most recent call last):
[rank0]:   File "x.py", line 1, in <module>
[rank0]: json.decoder.JSONDecodeError: Expecting value: line 1 column 1 (char 0)
[rank0]: During handling of the above exception, another exception occurred:
[rank0]: OSError: It looks like the config file at '/m/config.json' is not a valid JSON file.
E1124 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 1) local_rank: 0
Traceback (most recent call last):
  File "run.py", line 383, in launch_agent
torch.distributed.elastic.multiprocessing.errors.ChildFailedError: 
============================================================
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""
VLLM_TAIL = """(EngineCore pid=63) ERROR [core.py:1] EngineCore failed to start.
(EngineCore pid=63) RuntimeError: Worker failed: 'Available memory (16.7 GiB) is less than requested (512 GiB)'
Traceback (most recent call last):
RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
  warnings.warn('resource_tracker: There appear to be 1 leaked shared_memory objects')
"""


def test_the_cause_line_of_a_dead_service_skips_wrappers_and_prefixes():
    assert cause_line(TORCHRUN_TAIL) == ("OSError: It looks like the config file at '/m/config.json' is not a valid "
                                         "JSON file.")
    assert cause_line(VLLM_TAIL).startswith("RuntimeError: Worker failed: 'Available memory")
    assert cause_line("loading\n/settings.json: max_model_len: Input should be >= 8\n") == \
        "/settings.json: max_model_len: Input should be >= 8"
    structured = json.dumps({"event": "engine_failed", "level": "error", "exception": "Traceback\nValueError: bad"})
    assert cause_line(f"{structured}\n") == "ValueError: bad"
    assert cause_line("") is None


def test_the_cause_line_is_found_inside_output_the_json_logging_wrapped():
    """A service's log as tandem.torchrun writes it: the ranks' and torchrun's own lines wrapped
    as `{"event": "output", "text": ...}` (tandem/process_logs.py)."""
    wrapped = "\n".join(json.dumps({"service": "torchrun", "event": "output", "text": line, "level": "info"})
                        for line in TORCHRUN_TAIL.splitlines())
    assert cause_line(wrapped) == cause_line(TORCHRUN_TAIL)
    assert cause_line(wrapped).startswith("OSError: It looks like the config file")


def test_a_local_run_on_a_gpu_machine_must_declare_its_gpus():
    from coordinator.preflight.machine import check_gpus_declared

    with pytest.raises(ConfigError, match=r"cluster.gpus_per_node=8"):
        check_gpus_declared(load_config(), 8)
    check_gpus_declared(load_config(), 0)  # CPU machine
    check_gpus_declared(load_config(overrides=["cluster.gpus_per_node=2", "cluster.trainer_ranks=1"]), 8)
    check_gpus_declared(load_config(overrides=["cluster.launch=external"]), 8)  # placed by someone else


def test_visible_gpus_are_counted_from_the_driver_without_torch(tmp_path, monkeypatch):
    from coordinator.preflight.machine import _visible_gpus

    driver = tmp_path / "gpus"
    assert _visible_gpus(driver) == 0  # no NVIDIA driver
    for bus in ("0000:01:00.0", "0000:02:00.0", "0000:03:00.0"):
        (driver / bus).mkdir(parents=True)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert _visible_gpus(driver) == 3
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,2")
    assert _visible_gpus(driver) == 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert _visible_gpus(driver) == 0  # hidden
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")
    assert _visible_gpus(driver) == 0
