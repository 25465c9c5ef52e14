import abc
from typing import Any, ClassVar

from aiokafka.protocol.struct import Struct

class Response(Struct, metaclass=abc.ABCMeta):
    API_KEY: ClassVar[int]
    API_VERSION: ClassVar[int]
    def to_object(self) -> dict[str, Any]: ...

class Request(abc.ABC):
    API_KEY: ClassVar[int]
