"""What the trainer's unit tests share: a torch.distributed world of one gloo rank (a FileStore,
no torchrun), for tests that drive a backend in process."""

import pytest
import torch
import torch.distributed as dist

from trainer_svc.distributed import DistEnv


@pytest.fixture(scope="module")
def world_of_one(tmp_path_factory):
    store = dist.FileStore(str(tmp_path_factory.mktemp("dist") / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield DistEnv(0, 1, 0, torch.device("cpu"), dist.group.WORLD)
    dist.destroy_process_group()
