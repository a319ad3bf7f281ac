"""reward_svc as a real process on 127.0.0.1: scoring, auth, health, clear errors."""

import json

import pytest

from reward_svc.client import RewardClient
from reward_svc.types import ScoreItem
from tandem.rpc import RpcFailure, Status, check_health
from tests import procs

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def reward(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("reward")
    settings = workdir / "reward.json"
    settings.write_text(json.dumps({"tasks": {"arithmetic": "exact", "math": "math"}, "num_workers": 1}))
    service = procs.start(procs.python_module("reward_svc", "--settings", str(settings)), workdir, "reward")
    yield service
    assert service.stop() == 0, service.log()[-2000:]


def test_scores_through_real_grpc(reward):
    client = RewardClient(reward.address, procs.TOKEN)
    results = client.score([ScoreItem("arithmetic", "1+2=", "3", "3"), ScoreItem("arithmetic", "1+2=", "4", "3"),
                            ScoreItem("math", "q", r"thus \boxed{\frac{3}{4}}", "0.75"),
                            ScoreItem("math", "q", "0.7", "3/4")])
    assert [r.correct for r in results] == [True, False, True, False]
    assert client.info().tasks == ("arithmetic", "math")
    client.close()


def test_health_is_serving_without_token(reward):
    assert check_health(reward.address, "tandem.reward.v1.RewardService")


def test_call_without_token_is_refused(reward):
    client = RewardClient(reward.address, None)
    with pytest.raises(RpcFailure) as err:
        client.info()
    assert err.value.status is Status.UNAUTHENTICATED
    wrong = RewardClient(reward.address, "wrong-token")
    with pytest.raises(RpcFailure) as err:
        wrong.info()
    assert err.value.status is Status.UNAUTHENTICATED


def test_unknown_task_is_a_clear_invalid_argument(reward):
    client = RewardClient(reward.address, procs.TOKEN)
    with pytest.raises(RpcFailure) as err:
        client.score([ScoreItem("chess", "", "", "")])
    assert err.value.status is Status.INVALID_ARGUMENT
    assert "chess" in err.value.details and "arithmetic" in err.value.details


def test_a_service_whose_coordinator_never_answers_stops_by_itself(tmp_path):
    """Started for a run that is already over (or never came up): exit 1 with one line saying
    why, not a retry loop for ever."""
    nobody = f"127.0.0.1:{procs.free_port()}"
    service = procs.start(procs.python_module("reward_svc", "--coordinator", nobody, "--coordinator-wait-s", "2"),
                          tmp_path, "orphan")
    try:
        assert service.process.wait(timeout=60) == 1, service.log()[-3000:]
    finally:
        service.stop()
    gone = [json.loads(line) for line in service.log().splitlines() if '"coordinator_gone"' in line]
    assert len(gone) == 1 and nobody in gone[0]["message"], service.log()[-3000:]
