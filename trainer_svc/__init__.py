"""trainer_svc: the Tandem trainer service.

Launched by torchrun (`torchrun --nproc-per-node N -m trainer_svc --settings trainer.json`).
Holds the policy and its frozen reference under a training backend (DTensor/FSDP2), computes
logprobs, runs GRPO/SFT optimizer steps, checkpoints, exports HF checkpoints, and sends
weights to generators. Rank 0 serves gRPC (`tandem.trainer.v1.TrainerService`) and drives
every rank in lockstep. Other services use only `trainer_svc.client` and `trainer_svc.types`.
"""
