"""coordinator.cli.container: what each role runs and the settings it writes, from the same
experiment config; tandem.probe against a real gRPC health server."""

import asyncio
import json
import threading

import pytest
import structlog

from coordinator.cli import container
from coordinator.config import load_config
from coordinator.embedded.tiny_model import build_tiny_model
from tandem import probe
from tandem.rpc import start_server


def _args(*argv: str):
    return container.parse_args(list(argv))


@pytest.fixture
def model(tmp_path):
    """A real (tiny) checkpoint directory: config load checks the model against the config."""
    return build_tiny_model(tmp_path / "model")


def test_experiment_is_read_from_env_then_argv(monkeypatch):
    monkeypatch.setenv("TANDEM_CONFIG", "/experiments/x.yaml")
    monkeypatch.setenv("TANDEM_OVERRIDES", "grpo.max_num_steps=3  sft.max_num_steps=0")
    args, extra = _args("generator", "--", "grpo.seed=7")
    assert args.role == "generator" and args.coordinator == "coordinator:50051"
    assert container.experiment_args(extra) == ("/experiments/x.yaml",
                                                ["grpo.max_num_steps=3", "sft.max_num_steps=0", "grpo.seed=7"])


def test_coordinator_launches_nothing_and_binds_a_fixed_port():
    argv = container.coordinator_argv(None, ["cluster.num_generators=3"], "0.0.0.0", 50051)
    cfg = load_config(None, argv[1:])
    assert cfg.cluster.launch == "external" and cfg.cluster.port == 50051 and cfg.cluster.host == "0.0.0.0"
    assert cfg.cluster.num_generators == 3


def test_each_role_gets_its_own_settings_from_the_experiment(tmp_path, model):
    overrides = [f"policy.model_name={model}", "grpo.seed=5", "env.arithmetic.num_workers=2"]
    for role, extra in (("trainer", []), ("generator", ["--index", "2"]), ("reward", ["--task", "arithmetic"])):
        args, _ = _args(role, "--coordinator", "127.0.0.1:1", "--host", "127.0.0.1", "--port", "0", *extra)
        argv = container.service_argv(args, None, overrides, tmp_path)
        assert argv[argv.index("--coordinator") + 1] == "127.0.0.1:1"
        assert argv[argv.index("--advertise-host") + 1] == "127.0.0.1"  # the interface towards the coordinator
        settings = json.loads((tmp_path / f"{role}.json").read_text())
        if role == "trainer":
            assert "--rdzv-conf=store_type=file" in argv and settings["weight_sync_host"] == "127.0.0.1"
            assert settings["model_name"] == str(model) and settings["seed"] == 5
        elif role == "generator":
            assert settings["seed"] == 7 and argv[2] == "generator_svc"
        else:
            assert settings["tasks"] == {"arithmetic": "exact"} and settings["num_workers"] == 2


def test_trainer_node_of_a_multi_node_rendezvous(tmp_path, model):
    args, _ = _args("trainer", "--coordinator", "127.0.0.1:1", "--nnodes", "2", "--node-rank", "1",
                    "--rdzv-endpoint", "10.0.0.1:29400", "--ranks", "1")
    argv = container.service_argv(args, None, [f"policy.model_name={model}"], tmp_path)
    assert {"--nnodes=2", "--node-rank=1", "--rdzv-backend=c10d", "--rdzv-endpoint=10.0.0.1:29400",
            "--nproc-per-node=1", "--local-addr=127.0.0.1"} <= set(argv)
    assert "--standalone" not in argv


@pytest.mark.parametrize("argv, message", [
    (["trainer", "--coordinator", "127.0.0.1:1", "--nnodes", "2"], "--rdzv-endpoint"),
    (["reward", "--coordinator", "127.0.0.1:1", "--task", "poetry"], "poetry"),
    (["generator", "--coordinator", "nocolon"], "HOST:PORT"),
    (["generator", "--coordinator", "no-such-host.invalid:1"], "cannot resolve"),
])
def test_mistakes_are_clear_errors(tmp_path, model, argv, message):
    args, _ = _args(*argv)
    with pytest.raises(SystemExit, match=message):
        container.service_argv(args, None, [f"policy.model_name={model}"], tmp_path)


def test_reward_without_a_task_is_refused(capsys):
    with pytest.raises(SystemExit):
        _args("reward")
    assert "--task" in capsys.readouterr().err


def test_probe_follows_readiness_of_a_real_server():
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    running = asyncio.run_coroutine_threadsafe(start_server(
        [], ["tandem.generator.v1.GeneratorService"], host="127.0.0.1", port=0, token="t",
        log=structlog.get_logger()), loop).result(30)
    address = f"127.0.0.1:{running.port}"
    try:
        assert probe.main([address]) == 1  # the whole server ("") is not ready while its engine loads
        assert probe.main([address, "generator"]) == 1  # nor is its service
        asyncio.run_coroutine_threadsafe(running.mark_ready(), loop).result(30)
        assert probe.main([address, "generator"]) == 0 and probe.main([address]) == 0
        asyncio.run_coroutine_threadsafe(running.mark_not_serving(), loop).result(30)  # e.g. draining
        assert probe.main([address]) == 1
    finally:
        asyncio.run_coroutine_threadsafe(running.stop(0), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
    assert probe.main([address, "generator", "--timeout-s", "1"]) == 1
