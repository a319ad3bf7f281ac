import torch

from trainer_svc.held_bytes import HeldBytes


def test_counts_a_storage_once_until_its_last_tracked_tensor_is_freed():
    held = HeldBytes()
    full = held.track(torch.zeros(256))  # 1024 bytes
    q, k = held.track(full[:128]), held.track(full[128:])  # views: the same storage
    assert held.current == held.peak == 1024
    del full, q
    assert held.current == 1024  # k still holds the storage
    other = held.track(torch.zeros(64))
    assert (held.current, held.peak) == (1280, 1280)
    del k, other
    assert held.current == 0 and held.peak == 1280
    held.reset()
    assert held.peak == 0
    held.track(torch.zeros(0))  # nothing to count
    assert held.current == 0
