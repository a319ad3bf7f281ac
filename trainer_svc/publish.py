"""Publishing a weight version: every trainer rank streams its part of the HF tensors
(`TrainerBackend.iter_hf_tensors`: TP gathers, pipeline sends, `full_tensor()`), and rank 0
packs each tensor into the bucket plan's current bucket as it arrives and broadcasts the
bucket to the generators (`WeightSender.send`). Rank 0 holds two buckets (one filling, one on
the wire) and one gathered tensor, never the whole model.

Lockstep: the gathers are collectives over the trainer's own groups, so rank 0 must take part
in all of them even when its broadcast fails part-way (a dead generator, a tensor the plan
does not expect): it then drains the export without sending and raises afterwards, and the
other ranks finish the command as usual. The receivers are never left with a complete
transfer: the sender closes the group under them (see `tandem.weight_sync.iter_buckets`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

from tandem.weight_sync import BucketPlan, GroupSpec, WeightSender


def publish_weights(tensors: Iterable[tuple[str, torch.Tensor]], sender: WeightSender | None, group: GroupSpec,
                    version: int, plan: BucketPlan) -> int:
    """Collective (every rank, same order): broadcast `tensors` as `version` from rank 0 (the one
    with a `sender`); returns the bytes sent (0 on other ranks).

    Raises ValueError when the tensors do not match the plan and ConnectionError when the
    weight-sync group fails; an error of the export itself propagates unchanged.
    """
    export_failed: list[BaseException] = []
    watched = _watch(tensors, export_failed)
    try:
        if sender is None:
            return 0
        try:
            return sender.send(group, version, plan, watched)
        except RuntimeError as exc:  # gloo/NCCL timeouts and dead peers: the group is unreachable
            if export_failed:
                raise
            raise ConnectionError(f"weight broadcast to epoch {group.epoch} failed: {exc}") from exc
    finally:
        for _ in watched:  # the other ranks' gathers wait for this rank's part in them
            pass


def _watch(tensors: Iterable[tuple[str, torch.Tensor]],
           failed: list[BaseException]) -> Iterator[tuple[str, torch.Tensor]]:
    """`tensors`, noting in `failed` an exception raised by the export itself."""
    try:
        yield from tensors
    except BaseException as exc:
        failed.append(exc)
        raise
