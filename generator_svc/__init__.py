"""generator_svc: one inference engine (vLLM) behind `tandem.generator.v1.GeneratorService`.

Streams completions (token ids, the untempered logprob of each sampled token, finish
reason, weight version) and receives new weights from the trainer over the weight-sync
collective, each bucket checked against its checksum, never serving a half-received or
corrupted version. Launch with `python -m generator_svc --settings
generator.json`; the typed client is `generator_svc.client.GeneratorClient`.
"""
