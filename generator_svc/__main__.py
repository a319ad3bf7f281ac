"""`python -m generator_svc --settings generator.json`: parse, set vLLM's environment, serve, stop.

The `__main__` guard is required: vLLM may start its engine processes with spawn
(`cpu_engine_start`, and on GPUs), which re-imports the main module.
"""

from __future__ import annotations

import asyncio
import os
import shutil

from tandem import service


def main(argv: list[str] | None = None) -> None:
    args = service.parse_args("Tandem generator service (vLLM)", argv)
    if args.settings is None:
        raise SystemExit("--settings PATH is required (a JSON file of generator_svc.config.GeneratorSettings)")
    from generator_svc.config import load_settings, run_dir, vllm_environment
    from tandem.rpc import TokenMissing, load_token

    settings = load_settings(args.settings)
    try:
        token = load_token()
    except TokenMissing as exc:
        raise SystemExit(f"generator_svc: {exc}") from None
    scratch = run_dir(settings, os.getpid())
    scratch.mkdir(parents=True, exist_ok=True)
    os.environ.update(vllm_environment(settings, dict(os.environ), scratch))  # before vLLM is imported
    if settings.kv_cache_space_gib is None:  # sized from the workload: an inherited setting would override it
        os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)
    # vLLM's own gloo groups stay on loopback too (tandem.stores imports torch: after the environment)
    from tandem.stores import loopback_collectives_env

    for name, value in loopback_collectives_env(args.host).items():
        os.environ.setdefault(name, value)
    from tandem.logs import configure_logging
    from tandem.process_logs import exit_now, vllm_logging_env

    log = configure_logging("generator", route_all=True)  # before vLLM: its processes inherit the output pipe
    os.environ.update(vllm_logging_env(scratch / "logging.json", "generator", dict(os.environ)))

    from generator_svc.server import serve

    log.info("settings", **settings.model_dump(mode="json"))
    try:
        code = asyncio.run(serve(settings, args, token, log))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    exit_now(code)  # vLLM's engine is shut down: the interpreter's teardown would only cost ~2 s


if __name__ == "__main__":
    main()
