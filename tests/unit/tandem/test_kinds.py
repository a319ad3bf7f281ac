"""tandem.kinds.ServiceKind mirrors the membership contract's ServiceKind, value for value."""

from protos.tandem.coordinator.v1 import coordinator_pb2 as pb
from tandem.convert import enum_from_pb, enum_to_pb
from tandem.kinds import ServiceKind


def test_the_python_enum_names_every_kind_of_the_proto_and_no_other():
    proto = {enum_from_pb(pb.ServiceKind.DESCRIPTOR, v.number) for v in pb.ServiceKind.DESCRIPTOR.values} - {None}
    assert proto == {kind.value for kind in ServiceKind}


def test_a_kind_goes_to_the_wire_and_back_as_itself():
    for kind in ServiceKind:
        assert ServiceKind(enum_from_pb(pb.ServiceKind.DESCRIPTOR, enum_to_pb(pb.ServiceKind.DESCRIPTOR, kind))) is kind
