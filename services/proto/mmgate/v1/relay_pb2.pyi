from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class MetadataPair(_message.Message):
    __slots__ = ("key", "value")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    key: str
    value: bytes
    def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...

class RelayedCall(_message.Message):
    __slots__ = ("call", "method", "request", "metadata", "timeout_seconds", "peer")
    CALL_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PEER_FIELD_NUMBER: _ClassVar[int]
    call: int
    method: str
    request: bytes
    metadata: _containers.RepeatedCompositeFieldContainer[MetadataPair]
    timeout_seconds: float
    peer: str
    def __init__(self, call: _Optional[int] = ..., method: _Optional[str] = ..., request: _Optional[bytes] = ..., metadata: _Optional[_Iterable[_Union[MetadataPair, _Mapping]]] = ..., timeout_seconds: _Optional[float] = ..., peer: _Optional[str] = ...) -> None: ...

class RelayUp(_message.Message):
    __slots__ = ("calls", "cancelled")
    CALLS_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    calls: _containers.RepeatedCompositeFieldContainer[RelayedCall]
    cancelled: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, calls: _Optional[_Iterable[_Union[RelayedCall, _Mapping]]] = ..., cancelled: _Optional[_Iterable[int]] = ...) -> None: ...

class RelayEnd(_message.Message):
    __slots__ = ("call", "code", "details", "trailing")
    CALL_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    DETAILS_FIELD_NUMBER: _ClassVar[int]
    TRAILING_FIELD_NUMBER: _ClassVar[int]
    call: int
    code: int
    details: str
    trailing: _containers.RepeatedCompositeFieldContainer[MetadataPair]
    def __init__(self, call: _Optional[int] = ..., code: _Optional[int] = ..., details: _Optional[str] = ..., trailing: _Optional[_Iterable[_Union[MetadataPair, _Mapping]]] = ...) -> None: ...

class RelayDown(_message.Message):
    __slots__ = ("calls", "messages", "ends")
    CALLS_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    ENDS_FIELD_NUMBER: _ClassVar[int]
    calls: _containers.RepeatedScalarFieldContainer[int]
    messages: _containers.RepeatedScalarFieldContainer[bytes]
    ends: _containers.RepeatedCompositeFieldContainer[RelayEnd]
    def __init__(self, calls: _Optional[_Iterable[int]] = ..., messages: _Optional[_Iterable[bytes]] = ..., ends: _Optional[_Iterable[_Union[RelayEnd, _Mapping]]] = ...) -> None: ...
