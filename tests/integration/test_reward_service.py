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
