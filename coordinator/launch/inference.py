"""What evaluating a model needs and no more: the coordinator's membership server, the
generators (vLLM loads the model from its directory) and one reward service per task, launched
as local children like LocalCluster's; no trainer. `tandem eval` of an HF checkpoint uses it."""

from __future__ import annotations

from coordinator.config import ExperimentConfig
from coordinator.launch.launcher import LocalLauncher, ServiceSpec, python_module
from coordinator.launch.local import LocalCluster
from coordinator.launch.specs import generator_settings, reward_settings, scratch_root
from coordinator.membership.registry import Member
from tandem.kinds import ServiceKind


def launch_inference(cfg: ExperimentConfig, model_dir: str, run_dir, coordinator: str, launcher: LocalLauncher) -> None:
    """cluster.num_generators generators and a reward service per task (not those marked external)."""
    settings_dir = run_dir / "services"
    settings_dir.mkdir(parents=True, exist_ok=True)
    common = ["--host", cfg.cluster.host, "--coordinator", coordinator]
    for index in range(cfg.cluster.num_generators):
        name = f"generator-{index}"
        path = settings_dir / f"{name}.json"
        path.write_text(generator_settings(cfg, model_dir, index, scratch_root(run_dir) / name).model_dump_json())
        launcher.start(ServiceSpec(name, python_module("generator_svc", "--settings", str(path), *common),
                                   essential=False))
    for task in (t for t, env in cfg.env.items() if not env.external):  # an agent task's: its environment service
        path = settings_dir / f"reward-{task}.json"
        path.write_text(reward_settings(cfg, task).model_dump_json())
        launcher.start(ServiceSpec(f"reward-{task}", python_module("reward_svc", "--settings", str(path), *common),
                                   essential=False))


def inference_ready(cfg: ExperimentConfig):
    """Predicate over live members: every generator and every task's reward service."""
    def ready(members: list[Member]) -> bool:
        tasks = {t for m in members if m.kind is ServiceKind.REWARD for t in m.tasks}
        return sum(m.kind is ServiceKind.GENERATOR for m in members) >= cfg.cluster.num_generators and set(cfg.env) <= tasks
    return ready


class InferenceCluster(LocalCluster):
    """LocalCluster without the trainer (the model's own weights are what the generators serve)."""

    def _launch(self) -> None:
        launch_inference(self.cfg, self.model_dir, self.run_dir, self.address, self.launcher)

    def _ready(self):
        return inference_ready(self.cfg)
