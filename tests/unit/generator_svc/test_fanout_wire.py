"""The device wire of the TP fan-out (generator_svc/fanout.py): on GPUs each host bucket crosses
one device buffer over vLLM's NCCL device group; checked here with a CPU buffer and a fake broadcast."""

import torch

from generator_svc import fanout
from tandem.weight_sync import make_bucket_plan


def test_the_wire_carries_each_bucket_through_one_device_buffer(monkeypatch):
    plan = make_bucket_plan([("a", (100,), torch.uint8), ("b", (40,), torch.uint8)], bucket_bytes=100)
    wire = fanout._DeviceWire(torch.device("cpu"), plan)
    sent = []

    def broadcast(tensor, src, group):
        sent.append((tensor.untyped_storage().data_ptr(), tensor.clone(), src, group))
        tensor.fill_(7)  # what the source sent, as a receiver's buffer holds it after the broadcast

    monkeypatch.setattr(fanout.dist, "broadcast", broadcast)
    source = torch.arange(plan.bucket_sizes_bytes[0], dtype=torch.uint8)
    wire.broadcast(source, 3, "nccl-group", is_source=True)
    assert torch.equal(sent[0][1], source) and sent[0][2:] == (3, "nccl-group")  # copied in before it left
    received = torch.zeros(plan.bucket_sizes_bytes[1], dtype=torch.uint8)
    wire.broadcast(received, 3, "nccl-group", is_source=False)
    assert bool((received == 7).all())  # copied out after it arrived
    assert sent[0][0] == sent[1][0]  # one buffer for every bucket
