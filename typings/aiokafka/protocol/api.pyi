import abc
from typing import Any, ClassVar, Generic, TypeVar

from aiokafka.protocol.struct import Struct

class Response(Struct, metaclass=abc.ABCMeta):
    API_KEY: ClassVar[int]
    API_VERSION: ClassVar[int]
    def to_object(self) -> dict[str, Any]: ...

_T = TypeVar("_T")

class Request(abc.ABC, Generic[_T]):
    API_KEY: ClassVar[int]
    def build(self, request_struct_class: type[_T]) -> _T: ...

class RequestStruct(Struct, metaclass=abc.ABCMeta):
    API_KEY: ClassVar[int]
    API_VERSION: ClassVar[int]
    RESPONSE_TYPE: ClassVar[type[Response]]
