"""`python -m reward_svc --settings reward.json [--coordinator HOST:PORT]`: serve scorers."""

from __future__ import annotations

import asyncio

from reward_svc.config import RewardSettings
from reward_svc.engine import RewardEngine
from reward_svc.server import SERVICE_NAME, RewardServicer, add_to_server
from tandem.kinds import ServiceKind
from tandem.logs import configure_logging
from tandem.membership import Announcement, Load
from tandem.rpc import load_token, start_server
from tandem.service import load_settings, parse_args, serve

DRAIN_TIMEOUT_S = 30.0
"""How long a stopping reward service waits for its calls in flight (each item is bounded by
item_timeout_s; an agent episode by its timeout_s, which is waited for when longer); what is left
then is cut off and its callers send it elsewhere."""


async def main() -> int:
    args = parse_args("Tandem reward service")
    settings = load_settings(args.settings, RewardSettings)
    log = configure_logging("reward", route_all=True)
    token = load_token()
    log.info("settings", **settings.model_dump())
    engine = RewardEngine(settings, log)
    running = await start_server([lambda s: add_to_server(RewardServicer(engine), s)], [SERVICE_NAME],
                                 host=args.host, port=args.port, token=token, log=log)
    await engine.warm_up()
    address = f"{args.advertise_host or args.host}:{running.port}"
    announcement = Announcement(kind=ServiceKind.REWARD, address=address, tasks=settings.all_tasks)

    async def close() -> None:
        engine.close()

    async def drain() -> None:  # SIGTERM: leave the coordinator's rotation, finish the calls in flight
        await engine.drain(engine.drain_timeout_s(DRAIN_TIMEOUT_S))

    return await serve(running, args, announcement, Load, log, on_stop=close, drain=drain)


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
