from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EpisodeEnd(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EPISODE_END_UNSPECIFIED: _ClassVar[EpisodeEnd]
    EPISODE_END_REWARDED: _ClassVar[EpisodeEnd]
    EPISODE_END_TIMEOUT: _ClassVar[EpisodeEnd]
    EPISODE_END_ERROR: _ClassVar[EpisodeEnd]
    EPISODE_END_BAD_RETURN: _ClassVar[EpisodeEnd]
    EPISODE_END_REFUSED_CALL: _ClassVar[EpisodeEnd]
    EPISODE_END_NO_GENERATOR: _ClassVar[EpisodeEnd]
    EPISODE_END_JUDGE_UNPARSABLE: _ClassVar[EpisodeEnd]
EPISODE_END_UNSPECIFIED: EpisodeEnd
EPISODE_END_REWARDED: EpisodeEnd
EPISODE_END_TIMEOUT: EpisodeEnd
EPISODE_END_ERROR: EpisodeEnd
EPISODE_END_BAD_RETURN: EpisodeEnd
EPISODE_END_REFUSED_CALL: EpisodeEnd
EPISODE_END_NO_GENERATOR: EpisodeEnd
EPISODE_END_JUDGE_UNPARSABLE: EpisodeEnd

class ScoreItem(_message.Message):
    __slots__ = ("task", "prompt", "completion", "ground_truth")
    TASK_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_FIELD_NUMBER: _ClassVar[int]
    GROUND_TRUTH_FIELD_NUMBER: _ClassVar[int]
    task: str
    prompt: str
    completion: str
    ground_truth: str
    def __init__(self, task: _Optional[str] = ..., prompt: _Optional[str] = ..., completion: _Optional[str] = ..., ground_truth: _Optional[str] = ...) -> None: ...

class ScoreResult(_message.Message):
    __slots__ = ("reward", "correct")
    REWARD_FIELD_NUMBER: _ClassVar[int]
    CORRECT_FIELD_NUMBER: _ClassVar[int]
    reward: float
    correct: bool
    def __init__(self, reward: _Optional[float] = ..., correct: _Optional[bool] = ...) -> None: ...

class ScoreRequest(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[ScoreItem]
    def __init__(self, items: _Optional[_Iterable[_Union[ScoreItem, _Mapping]]] = ...) -> None: ...

class ScoreResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[ScoreResult]
    def __init__(self, results: _Optional[_Iterable[_Union[ScoreResult, _Mapping]]] = ...) -> None: ...

class GetInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetInfoResponse(_message.Message):
    __slots__ = ("tasks", "scorers", "multi_turn_tasks", "agent_tasks")
    class ScorersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TASKS_FIELD_NUMBER: _ClassVar[int]
    SCORERS_FIELD_NUMBER: _ClassVar[int]
    MULTI_TURN_TASKS_FIELD_NUMBER: _ClassVar[int]
    AGENT_TASKS_FIELD_NUMBER: _ClassVar[int]
    tasks: _containers.RepeatedScalarFieldContainer[str]
    scorers: _containers.ScalarMap[str, str]
    multi_turn_tasks: _containers.RepeatedScalarFieldContainer[str]
    agent_tasks: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, tasks: _Optional[_Iterable[str]] = ..., scorers: _Optional[_Mapping[str, str]] = ..., multi_turn_tasks: _Optional[_Iterable[str]] = ..., agent_tasks: _Optional[_Iterable[str]] = ...) -> None: ...

class Turn(_message.Message):
    __slots__ = ("completion", "observation")
    COMPLETION_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_FIELD_NUMBER: _ClassVar[int]
    completion: str
    observation: str
    def __init__(self, completion: _Optional[str] = ..., observation: _Optional[str] = ...) -> None: ...

class StepItem(_message.Message):
    __slots__ = ("task", "prompt", "ground_truth", "history", "completion")
    TASK_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    GROUND_TRUTH_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_FIELD_NUMBER: _ClassVar[int]
    task: str
    prompt: str
    ground_truth: str
    history: _containers.RepeatedCompositeFieldContainer[Turn]
    completion: str
    def __init__(self, task: _Optional[str] = ..., prompt: _Optional[str] = ..., ground_truth: _Optional[str] = ..., history: _Optional[_Iterable[_Union[Turn, _Mapping]]] = ..., completion: _Optional[str] = ...) -> None: ...

class StepResult(_message.Message):
    __slots__ = ("done", "observation", "reward", "correct")
    DONE_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    CORRECT_FIELD_NUMBER: _ClassVar[int]
    done: bool
    observation: str
    reward: float
    correct: bool
    def __init__(self, done: _Optional[bool] = ..., observation: _Optional[str] = ..., reward: _Optional[float] = ..., correct: _Optional[bool] = ...) -> None: ...

class StepRequest(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[StepItem]
    def __init__(self, items: _Optional[_Iterable[_Union[StepItem, _Mapping]]] = ...) -> None: ...

class StepResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[StepResult]
    def __init__(self, results: _Optional[_Iterable[_Union[StepResult, _Mapping]]] = ...) -> None: ...

class RunEpisodeRequest(_message.Message):
    __slots__ = ("task", "prompt", "ground_truth", "base_url", "api_key")
    TASK_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    GROUND_TRUTH_FIELD_NUMBER: _ClassVar[int]
    BASE_URL_FIELD_NUMBER: _ClassVar[int]
    API_KEY_FIELD_NUMBER: _ClassVar[int]
    task: str
    prompt: str
    ground_truth: str
    base_url: str
    api_key: str
    def __init__(self, task: _Optional[str] = ..., prompt: _Optional[str] = ..., ground_truth: _Optional[str] = ..., base_url: _Optional[str] = ..., api_key: _Optional[str] = ...) -> None: ...

class RunEpisodeResponse(_message.Message):
    __slots__ = ("end", "reward", "correct", "turn_rewards", "info_json")
    END_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    CORRECT_FIELD_NUMBER: _ClassVar[int]
    TURN_REWARDS_FIELD_NUMBER: _ClassVar[int]
    INFO_JSON_FIELD_NUMBER: _ClassVar[int]
    end: EpisodeEnd
    reward: float
    correct: bool
    turn_rewards: _containers.RepeatedScalarFieldContainer[float]
    info_json: str
    def __init__(self, end: _Optional[_Union[EpisodeEnd, str]] = ..., reward: _Optional[float] = ..., correct: _Optional[bool] = ..., turn_rewards: _Optional[_Iterable[float]] = ..., info_json: _Optional[str] = ...) -> None: ...
