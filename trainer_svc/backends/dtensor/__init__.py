"""The DTensor/FSDP2 backend: any HF causal LM, `fully_shard`ed per decoder layer and at the root."""

from trainer_svc.backends.dtensor.backend import DTensorBackend

__all__ = ["DTensorBackend"]
