"""The generator contract, shared by every engine that serves it (the vLLM generator service
and the trainer's own Megatron model): plain types (`types`), the engine Protocol (`engine`),
proto conversion (`convert`) and the gRPC servicer (`servicer`)."""
