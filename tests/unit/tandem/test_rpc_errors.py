"""The error interceptor of every server (tandem/rpc.py), on a real in-process server: bytes that
are not the method's message are INVALID_ARGUMENT (gRPC alone answers UNKNOWN), and an error
that quotes a huge input still reaches the caller as its status (its details are cut, or they
would overflow the trailing metadata and turn into RESOURCE_EXHAUSTED); the bounds of a
weight-sync group (tandem/convert.py)."""

import asyncio
import threading

import grpc
import pytest
import structlog

from protos.tandem.common.v1 import common_pb2
from protos.tandem.reward.v1 import reward_pb2, reward_pb2_grpc
from tandem.convert import MAX_OP_TIMEOUT_MS, group_from_pb
from tandem.rpc import MAX_DETAILS_CHARS, TOKEN_METADATA_KEY, start_server

SERVICE = "tandem.reward.v1.RewardService"


class Echo(reward_pb2_grpc.RewardServiceServicer):
    async def Score(self, request, context):
        raise ValueError(f"tasks {[i.task for i in request.items]} are not served here")

    async def Step(self, request, context):  # a service that hangs
        await asyncio.sleep(5)
        return reward_pb2.StepResponse()


@pytest.fixture(scope="module")
def address():
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    running = asyncio.run_coroutine_threadsafe(start_server(
        [lambda s: reward_pb2_grpc.add_RewardServiceServicer_to_server(Echo(), s)], [SERVICE], host="127.0.0.1",
        port=0, token="t", log=structlog.get_logger()), loop).result(30)
    yield running.address
    asyncio.run_coroutine_threadsafe(running.stop(0), loop).result(30)
    loop.call_soon_threadsafe(loop.stop)


def _score(address: str, payload: bytes) -> grpc.RpcError:
    with grpc.insecure_channel(address) as channel:
        with pytest.raises(grpc.RpcError) as caught:
            channel.unary_unary(f"/{SERVICE}/Score")(payload, metadata=[(TOKEN_METADATA_KEY, "t")], timeout=10)
    return caught.value


def test_bytes_that_are_no_message_are_invalid_argument(address):
    error = _score(address, b"\xff\xff\xff")
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "not a valid message" in error.details()


def test_an_error_quoting_a_huge_input_keeps_its_status(address):
    huge = reward_pb2.ScoreRequest(items=[reward_pb2.ScoreItem(task="x" * (2 << 20))]).SerializeToString()
    error = _score(address, huge)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details().startswith("ValueError: tasks ['xxx") and len(error.details()) < MAX_DETAILS_CHARS + 100


@pytest.mark.parametrize("fields", [{"world_size": 1 << 20}, {"op_timeout_ms": -1},
                                    {"op_timeout_ms": MAX_OP_TIMEOUT_MS + 1}, {"epoch": -1}])
def test_a_weight_sync_group_out_of_range_is_refused(fields):
    group = common_pb2.WeightSyncGroup(**{"store_address": "127.0.0.1:1", "world_size": 2, **fields})
    with pytest.raises(ValueError, match="out of range"):
        group_from_pb(group)


def test_a_port_another_server_holds_is_an_error_not_a_shared_port(address):
    """gRPC binds with SO_REUSEPORT unless told not to: a second coordinator on a fixed port then
    binds too and the kernel splits new connections between the two (a requeued Slurm run's
    services registered with the previous incarnation's coordinator, which was still stopping)."""
    port = int(address.rpartition(":")[2])

    async def second() -> None:
        running = await start_server([], [], host="127.0.0.1", port=port, token="t", log=structlog.get_logger())
        await running.stop(0)  # bound beside the first: stop it, so the failure is an assertion, not a hang

    with pytest.raises(OSError, match=f"127.0.0.1:{port}.*taken"):
        asyncio.run(second())


def test_an_expired_deadline_names_the_call_and_the_server(address):
    """gRPC's own "Deadline Exceeded" does not say what was waited for."""
    from reward_svc.client import RewardClient
    from reward_svc.types import StepItem
    from tandem.rpc import RpcFailure, Status

    client = RewardClient(address, "t", timeout_s=0.2)
    try:
        with pytest.raises(RpcFailure) as caught:
            client.step([StepItem(task="t", prompt="p", ground_truth="g", completion="c", history=())])
    finally:
        client.close()
    assert caught.value.status is Status.DEADLINE_EXCEEDED
    assert f"(waiting for RewardClient.step at {address})" in str(caught.value), str(caught.value)
