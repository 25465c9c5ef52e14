from aiokafka.protocol.api import Request

class MetadataRequest(Request):
    def __init__(self, topics: list[str] | None = None, allow_auto_topic_creation: bool | None = None) -> None: ...
