"""The descriptor-driven proto conversion every client and server uses: enum names by buf's
naming rule (and the domain's own spelling back), optional fields unset meaning the default,
nested messages, and the round trips of the trainer's and generator's plain types."""

import pytest
import torch

from protos.tandem.trainer.v1 import trainer_pb2 as pb
from tandem.convert import enum_from_pb, enum_names, enum_to_pb, from_pb, plan_from_pb, plan_to_pb, to_pb
from tandem.weight_sync import make_bucket_plan
from trainer_svc.config import TrainingBackend
from trainer_svc.types import GrpoLossConfig, TrainerInfo

TIS = pb.TruncatedImportanceSamplingType.DESCRIPTOR


def test_enum_names_follow_the_prefix_rule_both_ways():
    assert enum_to_pb(TIS, "seq-mask-tis") == pb.TRUNCATED_IMPORTANCE_SAMPLING_TYPE_SEQ_MASK_TIS
    assert enum_from_pb(TIS, pb.TRUNCATED_IMPORTANCE_SAMPLING_TYPE_ICEPOP) == "icepop"
    assert enum_from_pb(TIS, 0) is None  # UNSPECIFIED: the plain type's default applies
    assert enum_names(pb.KlType.DESCRIPTOR) == ["k1", "k2", "k3"]
    with pytest.raises(ValueError, match="not a KlType: use one of"):
        enum_to_pb(pb.KlType.DESCRIPTOR, "k4")
    with pytest.raises(ValueError, match="99 is not a Backend"):
        enum_from_pb(pb.Backend.DESCRIPTOR, 99)


def test_a_loss_config_round_trips_with_its_own_spellings_and_unset_optionals():
    config = GrpoLossConfig(ratio_clip_min=0.25, ratio_clip_max=0.5, token_level_loss=False,  # exact in float32
                            truncated_importance_sampling_ratio=1.5,
                            truncated_importance_sampling_type="seq-mask-tis",
                            truncated_importance_sampling_ratio_min=0.5, kl_input_clamp_value=None)
    message = to_pb(pb.GrpoLoss, config)
    assert not message.HasField("kl_input_clamp_value") and message.HasField("kl_output_clamp_value")
    assert GrpoLossConfig(**from_pb(message, GrpoLossConfig)) == config  # null (no clamp) survives; the default is 20


def test_nested_messages_are_copied_in_and_must_be_converted_by_hand_out():
    plan = make_bucket_plan([("w", (2, 3), torch.float32)], checksum_window_bytes=1 << 20)
    assert plan.window_ends == (1,)  # survives the trip below
    info = TrainerInfo("m", "fp", TrainingBackend.MEGATRON, 2, "cpu", "127.0.0.1:1", plan, 6, 3)
    message = to_pb(pb.GetInfoResponse, info, backend="megatron", bucket_plan=plan_to_pb(plan))
    assert message.backend == pb.BACKEND_MEGATRON and plan_from_pb(message.bucket_plan) == plan
    with pytest.raises(TypeError, match="bucket_plan is a message"):
        from_pb(message)
    assert from_pb(message, skip=("bucket_plan",))["global_step"] == 3
