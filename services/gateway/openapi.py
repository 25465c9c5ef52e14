"""The gateway's OpenAPI document, as committed in docs/openapi.json.

``python -m agentstream.services.gateway.openapi docs/openapi.json`` (``make openapi``) writes it from the
app; tests/unit/test_gateway_openapi.py fails when the committed copy differs from what the code gives,
so the document a client generates its code from is the one the gateway serves (``/openapi.json``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from agentstream.services.gateway.app import create_app
from agentstream.services.gateway.settings import GatewaySettings
from agentstream.streams.config.settings import Settings


def document() -> dict[str, Any]:
    """The document, independent of any deployment (no broker or database is contacted)."""
    app = create_app(Settings(kafka_bootstrap="127.0.0.1:9092", database_url="postgresql://localhost/agentstream"),
                     GatewaySettings())
    return app.openapi()


def text() -> str:
    return json.dumps(document(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def main(argv: list[str]) -> None:
    target = Path(argv[0]) if argv else Path("docs/openapi.json")
    target.write_text(text())
    print(f"wrote {target}")


if __name__ == "__main__":
    main(sys.argv[1:])
