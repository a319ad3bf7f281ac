"""reward_svc with a `code` task as a real process: hostile programs aimed at that very
service (its token in its environment, its settings file, its pid, its gRPC port) score 0
through gRPC, and afterwards the service is healthy and scores normal items correctly."""

import json
import os
import select
import socket

import pytest

from reward_svc.client import RewardClient
from reward_svc.types import ScoreItem
from tandem.rpc import check_health
from tests import procs

pytestmark = pytest.mark.integration

TESTS = json.dumps({"tests": ["assert square(3) == 9", "assert square(-2) == 4"], "entry_point": "square"})
ONLY_TEST = json.dumps({"tests": ["assert ok"]})


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("code-reward")
    settings = workdir / "reward.json"
    settings.write_text(json.dumps({"tasks": {"code": "code", "arithmetic": "exact"}, "num_workers": 2,
                                    "item_timeout_s": 4.0, "sandbox": {"cpu_s": 1, "wall_s": 2.0}}))
    running = procs.start(procs.python_module("reward_svc", "--settings", str(settings)), workdir, "reward")
    yield running, settings
    assert running.stop() == 0, running.log()[-2000:]


def _hostile(service_pid: int, settings_path: str, grpc_port: int, listener_port: int, drop: str) -> dict[str, str]:
    """Programs that set ok = True only if their attack on this service worked."""
    return {
        "token_from_environment": f"import os\nok = {procs.TOKEN!r} in repr(os.environ)",
        "token_from_service_environ": (
            f"ok = {procs.TOKEN!r}.encode() in open('/proc/{service_pid}/environ', 'rb').read()"),
        "token_from_any_environ": (
            "import os\nfor p in os.listdir('/proc'):\n    try:\n"
            f"        ok = ok or {procs.TOKEN!r}.encode() in open(f'/proc/{{p}}/environ', 'rb').read()\n"
            "    except OSError:\n        pass"),
        "read_settings_file": f"ok = 'sandbox' in open({settings_path!r}).read()",
        "call_the_grpc_port": f"import socket\nsocket.create_connection(('127.0.0.1', {grpc_port}), 1)\nok = True",
        "connect_to_listener": f"import socket\nsocket.create_connection(('127.0.0.1', {listener_port}), 1)\nok = True",
        "write_outside": f"open({drop!r}, 'w').write('x')\nok = True",
        "kill_the_service": f"import os\nos.kill({service_pid}, 9)\nok = True",
        "kill_minus_one": "import os\nos.kill(-1, 9)",
        "fork_bomb": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
        "memory_bomb": "x = bytearray(4 << 30)\nok = True",
        "infinite_loop": "while True:\n    pass",
        "huge_output": "while True:\n    print('x' * 100000)",
    }


def test_hostile_programs_score_zero_and_the_service_stays_healthy(service, tmp_path):
    running, settings = service
    listener = socket.create_server(("127.0.0.1", 0))
    drop = tmp_path / "escaped"
    tmp_path.chmod(0o777)
    hostile = _hostile(running.process.pid, str(settings), int(running.address.rsplit(":", 1)[1]),
                       listener.getsockname()[1], str(drop))
    client = RewardClient(running.address, procs.TOKEN, timeout_s=60.0)
    items = [ScoreItem("code", "", "ok = False\n" + program, ONLY_TEST) for program in hostile.values()]
    items += [ScoreItem("code", "", "```python\ndef square(x):\n    return x * x\n```", TESTS),
              ScoreItem("code", "", "def square(x):\n    return 9", TESTS)]
    results = client.score(items)
    rewards = dict(zip([*hostile, "good", "half"], [r.reward for r in results]))
    assert rewards == {**dict.fromkeys(hostile, 0.0), "good": 1.0, "half": 0.5}

    assert running.process.poll() is None and check_health(running.address, "tandem.reward.v1.RewardService")
    assert not select.select([listener], [], [], 0)[0] and not drop.exists()
    after = client.score([ScoreItem("code", "", "def square(x): return x ** 2", TESTS),
                          ScoreItem("arithmetic", "1+2=", "3", "3"), ScoreItem("arithmetic", "1+2=", "4", "3")])
    assert [r.correct for r in after] == [True, True, False]
    assert "TANDEM_TOKEN" in open(f"/proc/{running.process.pid}/environ").read()  # the secret was there to steal
    listener.close()
    client.close()
    assert os.path.exists(settings)
