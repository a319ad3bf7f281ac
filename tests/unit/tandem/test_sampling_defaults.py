"""SamplingParams fields left unset take the defaults the contract documents (top_p 1, top_k -1;
proto3 would otherwise read 0 and refuse top_p), also for bytes from a client built before the
fields were optional; n and max_tokens have no default and are refused unset."""

import pytest

from protos.tandem.generator.v1 import generator_pb2 as pb
from tandem.generation.convert import sampling_from_pb, sampling_to_pb
from tandem.generation.types import SamplingConfig


def test_unset_top_p_and_top_k_mean_their_documented_defaults():
    old_client_bytes = pb.SamplingParams(n=2, temperature=0.7, max_tokens=4).SerializeToString()
    sampling = sampling_from_pb(pb.SamplingParams.FromString(old_client_bytes))
    assert (sampling.top_p, sampling.top_k, sampling.seed) == (1.0, -1, None)


def test_set_values_travel_unchanged_and_unset_sizes_are_refused():
    sent = SamplingConfig(n=3, temperature=0.0, top_p=0.5, top_k=0, max_tokens=7, seed=11)
    assert sampling_from_pb(sampling_to_pb(sent)) == sent
    with pytest.raises(ValueError, match="n must be at least 1"):
        sampling_from_pb(pb.SamplingParams(temperature=1.0, max_tokens=4))
