"""Local mode's cluster: the coordinator's membership server plus every service launched
as a child process, as one context manager. `Run` uses it; so do the integration tests.
With `cluster.launch: external` (docker compose, several hosts) it launches nothing and waits
for the services, started by someone else with `--coordinator`, to register.

    with LocalCluster(cfg, model_dir, run_dir, token, log) as services:
        services.trainer.info() ...

A coordinator restarted on a run (`adopt=True`, what resuming does) serves on the address
the previous one wrote to <run>/coordinator.addr, so the services that outlived it (they
run in their own sessions) re-register by themselves; it adopts those it finds alive in
<run>/services.json and launches only what is missing. A fresh start stops any such
leftovers instead.

Once every service has registered, a supervisor (coordinator/launch/supervisor.py) relaunches
the generators and reward services that die (local mode) and tells `notify` (the run's
console) what the run is waiting for while a service it needs is missing.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from coordinator.config import ExperimentConfig
from coordinator.launch.launcher import LocalLauncher
from coordinator.launch.specs import all_registered, launch_all, scratch_root
from coordinator.launch.supervisor import Need, Supervisor
from coordinator.membership.registry import Registry
from coordinator.membership.server import CoordinatorServer
from coordinator.membership.services import Services
from coordinator.membership.status import RunStatus
from coordinator.membership.vitals import process_vitals
from tandem.host_memory import ALLOCATOR_VAR, TCMALLOC, allocator_env, find_tcmalloc, huge_pages_env
from tandem.kinds import ServiceKind

CHILD_ENV = {  # each service's threads: specs.service_threads
    "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",  # reliable torchrun restarts over gloo (notes/distributed-cpu)
    "PYTHONUNBUFFERED": "1",
}


def child_env(token: str, environ: Mapping[str, str]) -> dict[str, str]:
    """What every launched service's environment gets on top of `environ` (this process's, read
    when the run starts): the run's token, CHILD_ENV, and huge pages for torch's tensors unless
    `environ` chose (tandem/host_memory.py)."""
    return {"TANDEM_TOKEN": token, **CHILD_ENV, **huge_pages_env(environ)}


def tensor_service_env(environ: Mapping[str, str], log) -> dict[str, str]:
    """What the services that hold tensors (trainer, critic, generators) get on top of child_env:
    tcmalloc preloaded unless `environ` chose (tandem/host_memory.py); a warning when the host has
    none. Raises ValueError on a bad TANDEM_MALLOC, before anything starts."""
    tcmalloc = find_tcmalloc()
    env = allocator_env(environ, tcmalloc)
    if tcmalloc is None and environ.get(ALLOCATOR_VAR) != "system":
        log.warning("tcmalloc_not_found", library=TCMALLOC,
                    consequence="the trainer and generators use the system's malloc: on CPU their steps and weight "
                                "updates fault in fresh memory each time (slower; tandem/host_memory.py)",
                    fix="install it (Debian/Ubuntu: apt-get install libtcmalloc-minimal4) or set TANDEM_MALLOC=system")
    return env


def _previous_port(run_dir: Path) -> int:
    """The port of the coordinator that served this run before (0 if none)."""
    path = run_dir / "coordinator.addr"
    return int(path.read_text().strip().rpartition(":")[2]) if path.is_file() else 0


class AddressTaken(RuntimeError):
    """The coordinator's port is held by another process where the run's services look for it."""


class HostedService(Protocol):
    """A service the caller runs in this process (the Python API's reward_fn): started once the
    coordinator serves, so it can register like any launched service, and stopped at the end."""

    def start(self, coordinator_address: str, token: str, host: str) -> None: ...
    def stop(self) -> None: ...


class LocalCluster:
    def __init__(self, cfg: ExperimentConfig, model_dir: str, run_dir: Path, token: str, log,
                 status: RunStatus | None = None, hosted: Sequence[HostedService] = (), adopt: bool = False,
                 trainer_only: bool = False, meanwhile: Callable[[], object] | None = None,
                 notify: Callable[[str], None] | None = None):
        """trainer_only: launch and wait for the trainer alone (e.g. to export a checkpoint).
        meanwhile: work to do while the services boot (after they are launched, before waiting).
        notify: where the supervisor says what the run waits for (the run's console)."""
        self.cfg = cfg
        self.meanwhile = meanwhile
        self.trainer_only = trainer_only
        self.model_dir = model_dir
        self.run_dir = run_dir
        self.log = log
        self.status = status or RunStatus(run_dir.name)
        # Local launches are this host's processes: a silent one that is busy is not lost (registry.py).
        self.registry = Registry(log, vitals=process_vitals if cfg.cluster.launch.starts_services else None)
        self.adopt = adopt
        self.server = CoordinatorServer(self.registry, self.status, host=cfg.cluster.host,
                                        port=(_previous_port(run_dir) if adopt else 0) or cfg.cluster.port,
                                        token=token, log=log)
        self.launcher = LocalLauncher(run_dir / "logs", child_env(token, os.environ), log,
                                      state_file=run_dir / "services.json")
        # tcmalloc for a CPU run's trainer and generators; GPU runs keep the system's malloc, where
        # it was not measured (tandem/host_memory.py)
        self.tensor_env = (tensor_service_env(os.environ, log)
                           if cfg.cluster.launch.starts_services and not cfg.cluster.gpus_per_node else {})
        self.services = Services(self.registry, token, log)
        self.token = token
        self.hosted = list(hosted)
        self.address = ""
        self.startup_s = 0.0
        self.supervisor = Supervisor(self.launcher, self.registry, self.status, log, needs=self._needs, notify=notify,
                                     max_restarts=cfg.cluster.max_service_restarts, backoff_s=cfg.cluster.restart_backoff_s,
                                     relaunch=cfg.cluster.launch.starts_services,
                                     stopped_kill_s=cfg.cluster.stopped_kill_s)

    def __enter__(self) -> Services:
        started = time.perf_counter()
        try:
            self.address = self._serve()
            (self.run_dir / "coordinator.addr").write_text(self.address)
            leftovers = self.launcher.adopt()
            if leftovers and not self.adopt:  # a fresh start: an earlier coordinator's services go
                self.log.warning("leftover_services_stopped", names=leftovers)
                self.launcher.stop_all()
            for service in self.hosted:
                service.start(self.address, self.token, self.cfg.cluster.host)
            if self.cfg.cluster.launch.starts_services:
                self._launch()
            else:
                self.log.info("waiting_for_services", address=self.address, generators=self.cfg.cluster.num_generators,
                              tasks=sorted(self.cfg.env))
            if self.meanwhile is not None:
                self.meanwhile()
            self.registry.wait_for(self._ready(), self.cfg.cluster.startup_timeout_s, check=self.launcher.check)
            self.launcher.tolerate_nonessential_exits = True  # reward services may be swapped from now on
            self.supervisor.start()
        except BaseException:
            self.close()
            raise
        self.startup_s = time.perf_counter() - started
        return self.services

    def _launch(self) -> None:
        """Start the run's services as local children (cluster.launch local)."""
        launch_all(self.cfg, self.model_dir, self.run_dir, self.address, self.launcher, trainer_only=self.trainer_only,
                   tensor_env=self.tensor_env,
                   trainer_ready=lambda: self.registry.wait_for(
                       lambda members: any(m.kind is ServiceKind.TRAINER for m in members),
                       self.cfg.cluster.startup_timeout_s, check=self.launcher.check))

    def _ready(self):
        """The predicate over live members that start-up waits for."""
        return all_registered(self.cfg, self.trainer_only)

    def _serve(self) -> str:
        try:
            return self.server.start()
        except OSError as exc:  # the previous address is taken: services started before must be replaced
            if not self.cfg.cluster.launch.starts_services:  # services started elsewhere look for it here
                raise AddressTaken(f"the coordinator cannot listen where this run's services look for it ({exc}); "
                                  "stop the process that holds the port (an earlier coordinator of this run?) or "
                                  "set cluster.port") from exc
            self.log.warning("coordinator_address_taken", error=str(exc))
            self.adopt = False  # services that outlived the last coordinator cannot reach this one: replace them
            self.server = CoordinatorServer(self.registry, self.status, host=self.cfg.cluster.host, port=0,
                                            token=self.token, log=self.log)
            return self.server.start()

    def restart_trainer(self, kind: ServiceKind = ServiceKind.TRAINER) -> None:
        """Relaunch the trainer (kind CRITIC: a PPO run's critic; its process group is killed first)
        and wait until it registers; the generator the trainer served itself (policy.generation.backend
        megatron) goes with it. Its members are forgotten for good, live or suspected: a dropped
        one's late heartbeat (held back by a partition) must not pass the dead process off as the
        relaunched trainer."""
        old = [m for m in self.registry.live() + self.registry.suspected()
               if m.kind is kind or (kind is ServiceKind.TRAINER and m.shares_trainer_weights)]
        self.launcher.restart(str(kind))  # launched as "trainer" / "critic" (launch/specs.py)
        for member in old:
            self.registry.remove(member.member_id, reason=f"{kind} relaunched", may_return=False)
            self.services.forget(member.member_id)
        self.registry.wait_for(lambda members: any(m.kind is kind for m in members),
                               self.cfg.cluster.startup_timeout_s, check=self.launcher.check)

    def __exit__(self, *exc) -> None:
        self.close()

    def _needs(self) -> dict[str, Need]:
        """What the run cannot go on without, for the supervisor's notices."""
        launched = self.launcher.pids()
        needs = ({"the trainer": Need(ServiceKind.TRAINER)}
                 if "trainer" in launched or not self.cfg.cluster.launch.starts_services else {})
        if not self.trainer_only:
            plan = self.cfg.service_plan
            if plan.generator_services:
                needs["a generator"] = Need(ServiceKind.GENERATOR)
            if plan.teacher_services:
                needs["a distillation teacher"] = Need(ServiceKind.TEACHER)
            if plan.critic_ranks:
                needs["the PPO critic"] = Need(ServiceKind.CRITIC)

            needs.update({f"the reward service of task {task!r}": Need(ServiceKind.REWARD, task)
                          for task in plan.reward_tasks})
        return needs

    def close(self) -> None:
        self.supervisor.stop()  # before the services stop: nothing is relaunched from here on
        self.services.close()
        self.launcher.stop_all()
        for service in self.hosted:
            service.stop()
        self.server.stop()
        shutil.rmtree(scratch_root(self.run_dir), ignore_errors=True)
