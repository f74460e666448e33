from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ToolChoiceMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TOOL_CHOICE_MODE_UNSPECIFIED: _ClassVar[ToolChoiceMode]
    TOOL_CHOICE_MODE_NONE: _ClassVar[ToolChoiceMode]
    TOOL_CHOICE_MODE_AUTO: _ClassVar[ToolChoiceMode]
    TOOL_CHOICE_MODE_REQUIRED: _ClassVar[ToolChoiceMode]

class CachePolicy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CACHE_POLICY_UNSPECIFIED: _ClassVar[CachePolicy]
    CACHE_POLICY_RESPONSE: _ClassVar[CachePolicy]
    CACHE_POLICY_BYPASS: _ClassVar[CachePolicy]

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_STOP: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]
    FINISH_REASON_ABORT: _ClassVar[FinishReason]
    FINISH_REASON_TOOL_CALLS: _ClassVar[FinishReason]
TOOL_CHOICE_MODE_UNSPECIFIED: ToolChoiceMode
TOOL_CHOICE_MODE_NONE: ToolChoiceMode
TOOL_CHOICE_MODE_AUTO: ToolChoiceMode
TOOL_CHOICE_MODE_REQUIRED: ToolChoiceMode
CACHE_POLICY_UNSPECIFIED: CachePolicy
CACHE_POLICY_RESPONSE: CachePolicy
CACHE_POLICY_BYPASS: CachePolicy
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_STOP: FinishReason
FINISH_REASON_LENGTH: FinishReason
FINISH_REASON_ABORT: FinishReason
FINISH_REASON_TOOL_CALLS: FinishReason

class ChatMessage(_message.Message):
    __slots__ = ("role", "content", "tool_call_id", "tool_calls")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    tool_call_id: str
    tool_calls: _containers.RepeatedCompositeFieldContainer[ToolCall]
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ..., tool_call_id: _Optional[str] = ..., tool_calls: _Optional[_Iterable[_Union[ToolCall, _Mapping]]] = ...) -> None: ...

class Tool(_message.Message):
    __slots__ = ("name", "description", "parameters")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    parameters: str
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., parameters: _Optional[str] = ...) -> None: ...

class ToolCall(_message.Message):
    __slots__ = ("id", "name", "arguments")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    arguments: str
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., arguments: _Optional[str] = ...) -> None: ...

class ToolChoice(_message.Message):
    __slots__ = ("mode", "function")
    MODE_FIELD_NUMBER: _ClassVar[int]
    FUNCTION_FIELD_NUMBER: _ClassVar[int]
    mode: ToolChoiceMode
    function: str
    def __init__(self, mode: _Optional[_Union[ToolChoiceMode, str]] = ..., function: _Optional[str] = ...) -> None: ...

class Chat(_message.Message):
    __slots__ = ("messages", "tools", "tool_choice", "parallel_tool_calls")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CHOICE_FIELD_NUMBER: _ClassVar[int]
    PARALLEL_TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    tools: _containers.RepeatedCompositeFieldContainer[Tool]
    tool_choice: ToolChoice
    parallel_tool_calls: bool
    def __init__(self, messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ..., tools: _Optional[_Iterable[_Union[Tool, _Mapping]]] = ..., tool_choice: _Optional[_Union[ToolChoice, _Mapping]] = ..., parallel_tool_calls: _Optional[bool] = ...) -> None: ...

class SamplingParams(_message.Message):
    __slots__ = ("max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "presence_penalty", "frequency_penalty", "repetition_penalty", "min_p", "ignore_eos", "stream_interval", "min_tokens", "stop_token_ids", "include_stop_str_in_output", "skip_special_tokens", "logit_bias", "truncate_prompt_tokens", "json_schema", "regex", "grammar", "choice", "json_object", "n", "logprobs", "prompt_logprobs")
    class LogitBiasEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: float
        def __init__(self, key: _Optional[int] = ..., value: _Optional[float] = ...) -> None: ...
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    MIN_P_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    STREAM_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    MIN_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_STOP_STR_IN_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    SKIP_SPECIAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    LOGIT_BIAS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATE_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    JSON_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    REGEX_FIELD_NUMBER: _ClassVar[int]
    GRAMMAR_FIELD_NUMBER: _ClassVar[int]
    CHOICE_FIELD_NUMBER: _ClassVar[int]
    JSON_OBJECT_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    max_tokens: int
    temperature: float
    top_p: float
    top_k: int
    seed: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    presence_penalty: float
    frequency_penalty: float
    repetition_penalty: float
    min_p: float
    ignore_eos: bool
    stream_interval: int
    min_tokens: int
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    include_stop_str_in_output: bool
    skip_special_tokens: bool
    logit_bias: _containers.ScalarMap[int, float]
    truncate_prompt_tokens: int
    json_schema: str
    regex: str
    grammar: str
    choice: Choices
    json_object: bool
    n: int
    logprobs: int
    prompt_logprobs: int
    def __init__(self, max_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., seed: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ..., presence_penalty: _Optional[float] = ..., frequency_penalty: _Optional[float] = ..., repetition_penalty: _Optional[float] = ..., min_p: _Optional[float] = ..., ignore_eos: _Optional[bool] = ..., stream_interval: _Optional[int] = ..., min_tokens: _Optional[int] = ..., stop_token_ids: _Optional[_Iterable[int]] = ..., include_stop_str_in_output: _Optional[bool] = ..., skip_special_tokens: _Optional[bool] = ..., logit_bias: _Optional[_Mapping[int, float]] = ..., truncate_prompt_tokens: _Optional[int] = ..., json_schema: _Optional[str] = ..., regex: _Optional[str] = ..., grammar: _Optional[str] = ..., choice: _Optional[_Union[Choices, _Mapping]] = ..., json_object: _Optional[bool] = ..., n: _Optional[int] = ..., logprobs: _Optional[int] = ..., prompt_logprobs: _Optional[int] = ...) -> None: ...

class Choices(_message.Message):
    __slots__ = ("choices",)
    CHOICES_FIELD_NUMBER: _ClassVar[int]
    choices: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, choices: _Optional[_Iterable[str]] = ...) -> None: ...

class TokenIds(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ...) -> None: ...

class Image(_message.Message):
    __slots__ = ("data", "digest", "url", "mime_type")
    DATA_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    URL_FIELD_NUMBER: _ClassVar[int]
    MIME_TYPE_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    digest: str
    url: str
    mime_type: str
    def __init__(self, data: _Optional[bytes] = ..., digest: _Optional[str] = ..., url: _Optional[str] = ..., mime_type: _Optional[str] = ...) -> None: ...

class Video(_message.Message):
    __slots__ = ("data", "digest", "url", "mime_type", "num_frames", "fps")
    DATA_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    URL_FIELD_NUMBER: _ClassVar[int]
    MIME_TYPE_FIELD_NUMBER: _ClassVar[int]
    NUM_FRAMES_FIELD_NUMBER: _ClassVar[int]
    FPS_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    digest: str
    url: str
    mime_type: str
    num_frames: int
    fps: float
    def __init__(self, data: _Optional[bytes] = ..., digest: _Optional[str] = ..., url: _Optional[str] = ..., mime_type: _Optional[str] = ..., num_frames: _Optional[int] = ..., fps: _Optional[float] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("prompt", "chat", "token_ids", "sampling", "request_id", "cache_policy", "images", "adapter", "priority", "include_reasoning", "videos")
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    CHAT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CACHE_POLICY_FIELD_NUMBER: _ClassVar[int]
    IMAGES_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_REASONING_FIELD_NUMBER: _ClassVar[int]
    VIDEOS_FIELD_NUMBER: _ClassVar[int]
    prompt: str
    chat: Chat
    token_ids: TokenIds
    sampling: SamplingParams
    request_id: str
    cache_policy: CachePolicy
    images: _containers.RepeatedCompositeFieldContainer[Image]
    adapter: str
    priority: int
    include_reasoning: bool
    videos: _containers.RepeatedCompositeFieldContainer[Video]
    def __init__(self, prompt: _Optional[str] = ..., chat: _Optional[_Union[Chat, _Mapping]] = ..., token_ids: _Optional[_Union[TokenIds, _Mapping]] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., request_id: _Optional[str] = ..., cache_policy: _Optional[_Union[CachePolicy, str]] = ..., images: _Optional[_Iterable[_Union[Image, _Mapping]]] = ..., adapter: _Optional[str] = ..., priority: _Optional[int] = ..., include_reasoning: _Optional[bool] = ..., videos: _Optional[_Iterable[_Union[Video, _Mapping]]] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("prompt_tokens", "completion_tokens", "cached_prompt_tokens")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    completion_tokens: int
    cached_prompt_tokens: int
    def __init__(self, prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., cached_prompt_tokens: _Optional[int] = ...) -> None: ...

class CacheLookup(_message.Message):
    __slots__ = ("stage", "key", "outcome", "tier", "wait_ms", "reason")
    STAGE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    stage: str
    key: str
    outcome: str
    tier: str
    wait_ms: float
    reason: str
    def __init__(self, stage: _Optional[str] = ..., key: _Optional[str] = ..., outcome: _Optional[str] = ..., tier: _Optional[str] = ..., wait_ms: _Optional[float] = ..., reason: _Optional[str] = ...) -> None: ...

class ImageReport(_message.Message):
    __slots__ = ("digest", "outcome", "tier", "form")
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    FORM_FIELD_NUMBER: _ClassVar[int]
    digest: str
    outcome: str
    tier: str
    form: str
    def __init__(self, digest: _Optional[str] = ..., outcome: _Optional[str] = ..., tier: _Optional[str] = ..., form: _Optional[str] = ...) -> None: ...

class VideoReport(_message.Message):
    __slots__ = ("digest", "outcome", "tier", "form", "frames")
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    FORM_FIELD_NUMBER: _ClassVar[int]
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    digest: str
    outcome: str
    tier: str
    form: str
    frames: int
    def __init__(self, digest: _Optional[str] = ..., outcome: _Optional[str] = ..., tier: _Optional[str] = ..., form: _Optional[str] = ..., frames: _Optional[int] = ...) -> None: ...

class CacheReport(_message.Message):
    __slots__ = ("lookups", "cached_prompt_tokens", "response_from_cache", "images", "videos")
    LOOKUPS_FIELD_NUMBER: _ClassVar[int]
    CACHED_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FROM_CACHE_FIELD_NUMBER: _ClassVar[int]
    IMAGES_FIELD_NUMBER: _ClassVar[int]
    VIDEOS_FIELD_NUMBER: _ClassVar[int]
    lookups: _containers.RepeatedCompositeFieldContainer[CacheLookup]
    cached_prompt_tokens: int
    response_from_cache: bool
    images: _containers.RepeatedCompositeFieldContainer[ImageReport]
    videos: _containers.RepeatedCompositeFieldContainer[VideoReport]
    def __init__(self, lookups: _Optional[_Iterable[_Union[CacheLookup, _Mapping]]] = ..., cached_prompt_tokens: _Optional[int] = ..., response_from_cache: _Optional[bool] = ..., images: _Optional[_Iterable[_Union[ImageReport, _Mapping]]] = ..., videos: _Optional[_Iterable[_Union[VideoReport, _Mapping]]] = ...) -> None: ...

class Logprob(_message.Message):
    __slots__ = ("token_id", "logprob", "text")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    logprob: float
    text: str
    def __init__(self, token_id: _Optional[int] = ..., logprob: _Optional[float] = ..., text: _Optional[str] = ...) -> None: ...

class TokenLogprobs(_message.Message):
    __slots__ = ("token", "top")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    TOP_FIELD_NUMBER: _ClassVar[int]
    token: Logprob
    top: _containers.RepeatedCompositeFieldContainer[Logprob]
    def __init__(self, token: _Optional[_Union[Logprob, _Mapping]] = ..., top: _Optional[_Iterable[_Union[Logprob, _Mapping]]] = ...) -> None: ...

class TokenDelta(_message.Message):
    __slots__ = ("text", "token_ids", "index", "logprobs", "reasoning", "tool_calls")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    REASONING_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    text: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    index: int
    logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprobs]
    reasoning: str
    tool_calls: _containers.RepeatedCompositeFieldContainer[ToolCall]
    def __init__(self, text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., index: _Optional[int] = ..., logprobs: _Optional[_Iterable[_Union[TokenLogprobs, _Mapping]]] = ..., reasoning: _Optional[str] = ..., tool_calls: _Optional[_Iterable[_Union[ToolCall, _Mapping]]] = ...) -> None: ...

class SampleEnd(_message.Message):
    __slots__ = ("index", "finish_reason", "stop_string", "stop_token_id", "completion_tokens", "tool_calls", "tool_parse_error")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    STOP_STRING_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    TOOL_PARSE_ERROR_FIELD_NUMBER: _ClassVar[int]
    index: int
    finish_reason: FinishReason
    stop_string: str
    stop_token_id: int
    completion_tokens: int
    tool_calls: _containers.RepeatedCompositeFieldContainer[ToolCall]
    tool_parse_error: str
    def __init__(self, index: _Optional[int] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., stop_string: _Optional[str] = ..., stop_token_id: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., tool_calls: _Optional[_Iterable[_Union[ToolCall, _Mapping]]] = ..., tool_parse_error: _Optional[str] = ...) -> None: ...

class GenerateFinal(_message.Message):
    __slots__ = ("finish_reason", "usage", "cache", "request_id", "model", "samples", "prompt_logprobs", "adapter", "queue_ms", "priority")
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    CACHE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_FIELD_NUMBER: _ClassVar[int]
    QUEUE_MS_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    finish_reason: FinishReason
    usage: Usage
    cache: CacheReport
    request_id: str
    model: str
    samples: _containers.RepeatedCompositeFieldContainer[SampleEnd]
    prompt_logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprobs]
    adapter: Adapter
    queue_ms: float
    priority: int
    def __init__(self, finish_reason: _Optional[_Union[FinishReason, str]] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., cache: _Optional[_Union[CacheReport, _Mapping]] = ..., request_id: _Optional[str] = ..., model: _Optional[str] = ..., samples: _Optional[_Iterable[_Union[SampleEnd, _Mapping]]] = ..., prompt_logprobs: _Optional[_Iterable[_Union[TokenLogprobs, _Mapping]]] = ..., adapter: _Optional[_Union[Adapter, _Mapping]] = ..., queue_ms: _Optional[float] = ..., priority: _Optional[int] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("delta", "final")
    DELTA_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    delta: TokenDelta
    final: GenerateFinal
    def __init__(self, delta: _Optional[_Union[TokenDelta, _Mapping]] = ..., final: _Optional[_Union[GenerateFinal, _Mapping]] = ...) -> None: ...

class Choice(_message.Message):
    __slots__ = ("index", "text", "token_ids", "logprobs", "end", "reasoning")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    REASONING_FIELD_NUMBER: _ClassVar[int]
    index: int
    text: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprobs]
    end: SampleEnd
    reasoning: str
    def __init__(self, index: _Optional[int] = ..., text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[_Union[TokenLogprobs, _Mapping]]] = ..., end: _Optional[_Union[SampleEnd, _Mapping]] = ..., reasoning: _Optional[str] = ...) -> None: ...

class CompleteResponse(_message.Message):
    __slots__ = ("text", "token_ids", "final", "choices")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    CHOICES_FIELD_NUMBER: _ClassVar[int]
    text: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    final: GenerateFinal
    choices: _containers.RepeatedCompositeFieldContainer[Choice]
    def __init__(self, text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., final: _Optional[_Union[GenerateFinal, _Mapping]] = ..., choices: _Optional[_Iterable[_Union[Choice, _Mapping]]] = ...) -> None: ...

class GetModelInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ModelInfo(_message.Message):
    __slots__ = ("model", "max_model_len", "vocab_size", "eos_token_ids", "bos_token_id", "takes_images", "media_mode", "has_chat_template", "limits", "structured_output_backend", "adapters", "default_adapter", "scheduling", "tool_template", "tool_parser", "reasoning_parser", "takes_video", "video_mode")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    EOS_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    BOS_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    TAKES_IMAGES_FIELD_NUMBER: _ClassVar[int]
    MEDIA_MODE_FIELD_NUMBER: _ClassVar[int]
    HAS_CHAT_TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    STRUCTURED_OUTPUT_BACKEND_FIELD_NUMBER: _ClassVar[int]
    ADAPTERS_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_ADAPTER_FIELD_NUMBER: _ClassVar[int]
    SCHEDULING_FIELD_NUMBER: _ClassVar[int]
    TOOL_TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    TOOL_PARSER_FIELD_NUMBER: _ClassVar[int]
    REASONING_PARSER_FIELD_NUMBER: _ClassVar[int]
    TAKES_VIDEO_FIELD_NUMBER: _ClassVar[int]
    VIDEO_MODE_FIELD_NUMBER: _ClassVar[int]
    model: str
    max_model_len: int
    vocab_size: int
    eos_token_ids: _containers.RepeatedScalarFieldContainer[int]
    bos_token_id: int
    takes_images: bool
    media_mode: str
    has_chat_template: bool
    limits: ModelLimits
    structured_output_backend: str
    adapters: _containers.RepeatedCompositeFieldContainer[Adapter]
    default_adapter: str
    scheduling: Scheduling
    tool_template: str
    tool_parser: str
    reasoning_parser: str
    takes_video: bool
    video_mode: str
    def __init__(self, model: _Optional[str] = ..., max_model_len: _Optional[int] = ..., vocab_size: _Optional[int] = ..., eos_token_ids: _Optional[_Iterable[int]] = ..., bos_token_id: _Optional[int] = ..., takes_images: _Optional[bool] = ..., media_mode: _Optional[str] = ..., has_chat_template: _Optional[bool] = ..., limits: _Optional[_Union[ModelLimits, _Mapping]] = ..., structured_output_backend: _Optional[str] = ..., adapters: _Optional[_Iterable[_Union[Adapter, _Mapping]]] = ..., default_adapter: _Optional[str] = ..., scheduling: _Optional[_Union[Scheduling, _Mapping]] = ..., tool_template: _Optional[str] = ..., tool_parser: _Optional[str] = ..., reasoning_parser: _Optional[str] = ..., takes_video: _Optional[bool] = ..., video_mode: _Optional[str] = ...) -> None: ...

class Scheduling(_message.Message):
    __slots__ = ("weight", "priority", "min_priority", "max_priority")
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    MIN_PRIORITY_FIELD_NUMBER: _ClassVar[int]
    MAX_PRIORITY_FIELD_NUMBER: _ClassVar[int]
    weight: float
    priority: int
    min_priority: int
    max_priority: int
    def __init__(self, weight: _Optional[float] = ..., priority: _Optional[int] = ..., min_priority: _Optional[int] = ..., max_priority: _Optional[int] = ...) -> None: ...

class Adapter(_message.Message):
    __slots__ = ("name", "digest", "rank")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    name: str
    digest: str
    rank: int
    def __init__(self, name: _Optional[str] = ..., digest: _Optional[str] = ..., rank: _Optional[int] = ...) -> None: ...

class LoadAdapterRequest(_message.Message):
    __slots__ = ("name", "path")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    name: str
    path: str
    def __init__(self, name: _Optional[str] = ..., path: _Optional[str] = ...) -> None: ...

class LoadAdapterResponse(_message.Message):
    __slots__ = ("adapter", "replaced")
    ADAPTER_FIELD_NUMBER: _ClassVar[int]
    REPLACED_FIELD_NUMBER: _ClassVar[int]
    adapter: Adapter
    replaced: bool
    def __init__(self, adapter: _Optional[_Union[Adapter, _Mapping]] = ..., replaced: _Optional[bool] = ...) -> None: ...

class UnloadAdapterRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class UnloadAdapterResponse(_message.Message):
    __slots__ = ("requests_running",)
    REQUESTS_RUNNING_FIELD_NUMBER: _ClassVar[int]
    requests_running: int
    def __init__(self, requests_running: _Optional[int] = ...) -> None: ...

class ModelLimits(_message.Message):
    __slots__ = ("max_tokens", "max_images", "min_stream_interval", "max_message_bytes", "max_stop_strings", "max_stop_token_ids", "max_logit_bias", "max_constraint_chars", "max_choices", "max_samples", "max_logprobs", "max_tools", "max_tools_chars", "max_tool_calls", "max_videos", "max_video_frames", "max_video_bytes", "max_video_seconds", "max_video_frame_pixels")
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_IMAGES_FIELD_NUMBER: _ClassVar[int]
    MIN_STREAM_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_STOP_STRINGS_FIELD_NUMBER: _ClassVar[int]
    MAX_STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    MAX_LOGIT_BIAS_FIELD_NUMBER: _ClassVar[int]
    MAX_CONSTRAINT_CHARS_FIELD_NUMBER: _ClassVar[int]
    MAX_CHOICES_FIELD_NUMBER: _ClassVar[int]
    MAX_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    MAX_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOOLS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOOLS_CHARS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    MAX_VIDEOS_FIELD_NUMBER: _ClassVar[int]
    MAX_VIDEO_FRAMES_FIELD_NUMBER: _ClassVar[int]
    MAX_VIDEO_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_VIDEO_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MAX_VIDEO_FRAME_PIXELS_FIELD_NUMBER: _ClassVar[int]
    max_tokens: int
    max_images: int
    min_stream_interval: int
    max_message_bytes: int
    max_stop_strings: int
    max_stop_token_ids: int
    max_logit_bias: int
    max_constraint_chars: int
    max_choices: int
    max_samples: int
    max_logprobs: int
    max_tools: int
    max_tools_chars: int
    max_tool_calls: int
    max_videos: int
    max_video_frames: int
    max_video_bytes: int
    max_video_seconds: float
    max_video_frame_pixels: int
    def __init__(self, max_tokens: _Optional[int] = ..., max_images: _Optional[int] = ..., min_stream_interval: _Optional[int] = ..., max_message_bytes: _Optional[int] = ..., max_stop_strings: _Optional[int] = ..., max_stop_token_ids: _Optional[int] = ..., max_logit_bias: _Optional[int] = ..., max_constraint_chars: _Optional[int] = ..., max_choices: _Optional[int] = ..., max_samples: _Optional[int] = ..., max_logprobs: _Optional[int] = ..., max_tools: _Optional[int] = ..., max_tools_chars: _Optional[int] = ..., max_tool_calls: _Optional[int] = ..., max_videos: _Optional[int] = ..., max_video_frames: _Optional[int] = ..., max_video_bytes: _Optional[int] = ..., max_video_seconds: _Optional[float] = ..., max_video_frame_pixels: _Optional[int] = ...) -> None: ...

class AbortRequest(_message.Message):
    __slots__ = ("request_ids",)
    REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    request_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, request_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class AbortResponse(_message.Message):
    __slots__ = ("aborted",)
    ABORTED_FIELD_NUMBER: _ClassVar[int]
    aborted: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, aborted: _Optional[_Iterable[str]] = ...) -> None: ...

class TokenizeRequest(_message.Message):
    __slots__ = ("prompt", "chat")
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    CHAT_FIELD_NUMBER: _ClassVar[int]
    prompt: str
    chat: Chat
    def __init__(self, prompt: _Optional[str] = ..., chat: _Optional[_Union[Chat, _Mapping]] = ...) -> None: ...

class TokenizeResponse(_message.Message):
    __slots__ = ("token_ids", "max_model_len")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    max_model_len: int
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., max_model_len: _Optional[int] = ...) -> None: ...

class DetokenizeRequest(_message.Message):
    __slots__ = ("token_ids",)
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class DetokenizeResponse(_message.Message):
    __slots__ = ("text",)
    TEXT_FIELD_NUMBER: _ClassVar[int]
    text: str
    def __init__(self, text: _Optional[str] = ...) -> None: ...

class GetServerInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ServerInfo(_message.Message):
    __slots__ = ("version", "replica", "model", "max_model_len", "media_mode", "video_mode", "engine_slots", "max_concurrent_requests", "edges")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    MEDIA_MODE_FIELD_NUMBER: _ClassVar[int]
    VIDEO_MODE_FIELD_NUMBER: _ClassVar[int]
    ENGINE_SLOTS_FIELD_NUMBER: _ClassVar[int]
    MAX_CONCURRENT_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    EDGES_FIELD_NUMBER: _ClassVar[int]
    version: str
    replica: str
    model: str
    max_model_len: int
    media_mode: str
    video_mode: str
    engine_slots: int
    max_concurrent_requests: int
    edges: int
    def __init__(self, version: _Optional[str] = ..., replica: _Optional[str] = ..., model: _Optional[str] = ..., max_model_len: _Optional[int] = ..., media_mode: _Optional[str] = ..., video_mode: _Optional[str] = ..., engine_slots: _Optional[int] = ..., max_concurrent_requests: _Optional[int] = ..., edges: _Optional[int] = ...) -> None: ...

class GetLoadRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WatchLoadRequest(_message.Message):
    __slots__ = ("interval_ms",)
    INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    interval_ms: int
    def __init__(self, interval_ms: _Optional[int] = ...) -> None: ...

class PriorityLoad(_message.Message):
    __slots__ = ("priority", "slots_running", "waiting")
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    SLOTS_RUNNING_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    priority: int
    slots_running: int
    waiting: int
    def __init__(self, priority: _Optional[int] = ..., slots_running: _Optional[int] = ..., waiting: _Optional[int] = ...) -> None: ...

class StageLoad(_message.Message):
    __slots__ = ("stage", "entries", "bytes")
    STAGE_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    stage: str
    entries: int
    bytes: int
    def __init__(self, stage: _Optional[str] = ..., entries: _Optional[int] = ..., bytes: _Optional[int] = ...) -> None: ...

class PoolLoad(_message.Message):
    __slots__ = ("pool", "threads", "busy", "waiting")
    POOL_FIELD_NUMBER: _ClassVar[int]
    THREADS_FIELD_NUMBER: _ClassVar[int]
    BUSY_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    pool: str
    threads: int
    busy: int
    waiting: int
    def __init__(self, pool: _Optional[str] = ..., threads: _Optional[int] = ..., busy: _Optional[int] = ..., waiting: _Optional[int] = ...) -> None: ...

class Load(_message.Message):
    __slots__ = ("unix_seconds", "requests_in_progress", "request_headroom", "ready", "engine_running", "engine_waiting", "kv_cache_usage", "queue_waiting", "priorities", "media", "cache", "cache_bytes", "adapters_running")
    UNIX_SECONDS_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_IN_PROGRESS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_HEADROOM_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    ENGINE_RUNNING_FIELD_NUMBER: _ClassVar[int]
    ENGINE_WAITING_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_USAGE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_WAITING_FIELD_NUMBER: _ClassVar[int]
    PRIORITIES_FIELD_NUMBER: _ClassVar[int]
    MEDIA_FIELD_NUMBER: _ClassVar[int]
    CACHE_FIELD_NUMBER: _ClassVar[int]
    CACHE_BYTES_FIELD_NUMBER: _ClassVar[int]
    ADAPTERS_RUNNING_FIELD_NUMBER: _ClassVar[int]
    unix_seconds: float
    requests_in_progress: int
    request_headroom: int
    ready: bool
    engine_running: int
    engine_waiting: int
    kv_cache_usage: float
    queue_waiting: int
    priorities: _containers.RepeatedCompositeFieldContainer[PriorityLoad]
    media: _containers.RepeatedCompositeFieldContainer[PoolLoad]
    cache: _containers.RepeatedCompositeFieldContainer[StageLoad]
    cache_bytes: int
    adapters_running: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, unix_seconds: _Optional[float] = ..., requests_in_progress: _Optional[int] = ..., request_headroom: _Optional[int] = ..., ready: _Optional[bool] = ..., engine_running: _Optional[int] = ..., engine_waiting: _Optional[int] = ..., kv_cache_usage: _Optional[float] = ..., queue_waiting: _Optional[int] = ..., priorities: _Optional[_Iterable[_Union[PriorityLoad, _Mapping]]] = ..., media: _Optional[_Iterable[_Union[PoolLoad, _Mapping]]] = ..., cache: _Optional[_Iterable[_Union[StageLoad, _Mapping]]] = ..., cache_bytes: _Optional[int] = ..., adapters_running: _Optional[_Iterable[str]] = ...) -> None: ...
