"""Property-based fuzzing (tests/integration/fuzzing.py) of every RPC of the coordinator's server
and of a reward service, real servers on 127.0.0.1: at least 2,000 drawn messages each (random,
malformed, oversized, wrong tokens, garbage bytes), every answer a status that names the
caller's mistake, none an unhandled error or a hang; each server is healthy and answers a
correct call afterwards. Prints the counts and statuses (pytest -s shows them)."""

import json

import pytest
import structlog
from hypothesis import strategies as st

from coordinator.membership.client import CoordinatorClient
from coordinator.membership.registry import Registry
from coordinator.membership.server import SERVICE_NAME as COORDINATOR
from coordinator.membership.server import CoordinatorServer
from coordinator.membership.status import RunStatus
from protos.tandem.coordinator.v1 import coordinator_pb2 as cpb
from protos.tandem.reward.v1 import reward_pb2 as rpb
from reward_svc.client import RewardClient
from reward_svc.types import ScoreItem
from tandem.rpc import check_health
from tests import procs
from tests.integration.fuzzing import Fuzzer, messages, texts

pytestmark = pytest.mark.integration

REWARD = "tandem.reward.v1.RewardService"


def _fuzzed(fuzzer: Fuzzer) -> None:
    print("\n" + fuzzer.report())
    assert fuzzer.sent >= 2000
    assert not fuzzer.failures, f"{len(fuzzer.failures)} bad answers:\n" + "\n".join(fuzzer.failures[:30])


def test_the_coordinator_server_answers_every_fuzzed_message_with_the_callers_mistake():
    registry, log = Registry(structlog.get_logger()), structlog.get_logger()
    server = CoordinatorServer(registry, RunStatus("fuzz"), host="127.0.0.1", port=0, token=procs.TOKEN, log=log)
    address = server.start()
    fuzzer = Fuzzer(address, procs.TOKEN, COORDINATOR)
    members = st.one_of(st.sampled_from(["trainer-0", "generator-1", ""]), texts())
    addresses = st.one_of(st.sampled_from(["127.0.0.1:1", "localhost:65535", "[::1]:80", "host:0", "host:99999",
                                           ":50051", "host", "a:b:c"]), texts())
    try:
        fuzzer.fuzz("Register", messages(cpb.RegisterRequest.DESCRIPTOR, cpb.RegisterRequest,
                                         overrides={"address": addresses}), 800)
        fuzzer.fuzz("Heartbeat", messages(cpb.HeartbeatRequest.DESCRIPTOR, cpb.HeartbeatRequest,
                                          overrides={"member_id": members}), 500)
        fuzzer.fuzz("Deregister", messages(cpb.DeregisterRequest.DESCRIPTOR, cpb.DeregisterRequest,
                                           overrides={"member_id": members}), 400)
        fuzzer.fuzz("GetRunStatus", messages(cpb.GetRunStatusRequest.DESCRIPTOR, cpb.GetRunStatusRequest), 300)
        assert check_health(address, COORDINATOR) and check_health(address)
        with CoordinatorClient(address, procs.TOKEN) as client:
            assert client.run_status().run_id == "fuzz"
    finally:
        fuzzer.close()
        server.stop()
    _fuzzed(fuzzer)


@pytest.fixture(scope="module")
def reward(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("fuzz_reward")
    settings = workdir / "reward.json"
    settings.write_text(json.dumps({"tasks": {"arithmetic": "exact", "calc": "calculator"}, "num_workers": 1}))
    service = procs.start(procs.python_module("reward_svc", "--settings", str(settings)), workdir, "reward")
    yield service
    assert service.stop() == 0, service.log()[-2000:]


def test_a_reward_service_answers_every_fuzzed_message_with_the_callers_mistake(reward):
    fuzzer = Fuzzer(reward.address, procs.TOKEN, REWARD)
    tasks = st.one_of(st.sampled_from(["arithmetic", "calc"]), texts())
    expressions = st.one_of(st.sampled_from(["2+2", "<calc>1/0</calc>", "<calc>9**9**9</calc>", "<calc>(</calc>",
                                             "<calc>" + "1+" * 5000 + "1</calc>", "<calc>10**100000</calc>"]),
                            texts())
    overrides = {"task": tasks, "completion": expressions}
    try:
        fuzzer.fuzz("GetInfo", messages(rpb.GetInfoRequest.DESCRIPTOR, rpb.GetInfoRequest), 200)
        fuzzer.fuzz("Score", messages(rpb.ScoreRequest.DESCRIPTOR, rpb.ScoreRequest, overrides=overrides), 1000)
        fuzzer.fuzz("Step", messages(rpb.StepRequest.DESCRIPTOR, rpb.StepRequest, overrides=overrides), 1000)
        assert check_health(reward.address, REWARD) and check_health(reward.address)
        client = RewardClient(reward.address, procs.TOKEN)
        assert [r.correct for r in client.score([ScoreItem("arithmetic", "1+2=", "3", "3")])] == [True]
        client.close()
    finally:
        fuzzer.close()
    assert reward.process.poll() is None
    _fuzzed(fuzzer)

