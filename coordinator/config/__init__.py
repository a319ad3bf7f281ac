"""The experiment configuration (NeMo-RL's schema), parsed once into pydantic models that forbid
unknown keys. Sections: policy.* (policy.py), loss_fn.*, grpo.*, sft.* (algorithms.py), dpo.*,
rm.* (preference.py), data.* (data.py), env.* (env.py), cluster.*, checkpointing.*, logger.*
(run.py); the whole and its cross-section rules in experiment.py; files and overrides in loading.py.
"""

from coordinator.config.experiment import ExperimentConfig
from coordinator.config.loading import ConfigError, load_config

__all__ = ["ConfigError", "ExperimentConfig", "load_config"]
