"""Shared by every test: one vLLM cache for the whole suite. Most tests give each run a fresh
TANDEM_HOME (the build-once caches are part of what they check), which would also give every
generator a cold vLLM cache, and vLLM then inspects the model's architecture in a subprocess that
imports vLLM again (~6 s of CPU per generator start). The model-info cache is keyed by the hash
of vLLM's model file, so sharing it changes nothing else."""

import os
from pathlib import Path

os.environ.setdefault("VLLM_CACHE_ROOT", str(Path.home() / ".cache" / "tandem-tests" / "vllm-cache"))


def pytest_configure(config) -> None:
    """On a machine with a GPU the default run includes the `gpu` tests (gpu_present).

    Under pytest-xdist (`-n N`), each worker keeps to its own share of the machine's cores,
    and so does every process its tests start (the affinity is inherited). Tandem sizes each
    service's threads from the cores it may use (coordinator/launch/specs.py), so a worker's
    services run as on a machine of that share: without it two workers' services each took every
    core, their OpenMP threads spun against each other's, and the suite gained ~8% for two
    workers (one test took 5x as long)."""
    if config.option.markexpr == "not gpu" and gpu_present():  # pyproject's default: add the gpu tests
        config.option.markexpr = ""
    worker = os.environ.get("PYTEST_XDIST_WORKER")  # gw0, gw1, ...
    if not worker:
        return
    cores = sorted(os.sched_getaffinity(0))
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    share = cores[int(worker.removeprefix("gw")) % len(cores)::max(1, min(count, len(cores)))]
    os.sched_setaffinity(0, share)


def gpu_present() -> bool:
    """nvidia-smi lists a GPU: on such a machine the default run (`pytest -q`, pyproject's
    `-m 'not gpu'`) takes the `gpu` tests too; an explicit `-m` is left alone."""
    import shutil
    import subprocess

    if not shutil.which("nvidia-smi"):
        return False
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], check=False, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    return any(line.startswith("GPU ") for line in listed.splitlines())


LONGEST_FIRST = (
    "tests/integration/test_megatron_backend.py", "tests/integration/test_chaos.py", "tests/slurm/",
    "tests/integration/test_recipes.py",
    "tests/integration/test_resume.py", "tests/integration/test_model_families.py", "tests/integration/test_elastic.py",
    "tests/integration/test_megatron_grpo.py", "tests/integration/test_faults.py",
    "tests/integration/test_agent_gateway.py",
    "tests/integration/test_grpo_end_to_end.py", "tests/compose/", "tests/integration/test_megatron_moe.py",
    "tests/integration/test_fuzz_light_services.py", "tests/integration/test_megatron_generation.py",
    "tests/integration/test_run_output.py", "tests/integration/test_moe_grpo.py",
    "tests/integration/test_fuzz_engines.py", "tests/integration/test_dtensor_options.py", "tests/multihost/",
    "tests/integration/test_cli.py", "tests/integration/test_bad_inputs.py", "tests/integration/test_failover.py",
    "tests/integration/test_drift_guard.py", "tests/integration/test_chat_data.py", "tests/integration/test_restarts.py",
    "tests/integration/test_service_start_failures.py",
)
"""Test files that take a worker longest (35 s to a few minutes each), in that order, as
`pytest --durations=0` measured them (the sum of each file's setup, call and teardown times):
pytest-xdist hands whole files to workers in collection order (--dist loadfile with
--no-loadscope-reorder, in pyproject.toml: by default xdist reorders the files by their number
of tests, most first, which put 1-test files like the fault and Slurm runs anywhere, often last),
so these start first and the many short ones fill the gaps at the end, instead of one of them
running alone at the end. Re-measure when a file's time changes much."""


def pytest_collection_modifyitems(config, items) -> None:
    def rank(item) -> int:
        path = item.nodeid.split("::")[0]
        return next((i for i, prefix in enumerate(LONGEST_FIRST) if path.startswith(prefix)), len(LONGEST_FIRST))

    items.sort(key=rank)  # stable: the order within a file, and of the other files, stays
