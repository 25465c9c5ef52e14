"""Running the project's image with podman from tests: the settings that work on these machines
(infra/container/containers.conf) and one probe that says why, when podman cannot run containers here."""

from __future__ import annotations

import functools
import os
import shutil
from pathlib import Path

import pytest

from agentstream.deploy.podman import podman

ROOT = Path(__file__).resolve().parents[2]
IMAGE = os.environ.get("AGENTSTREAM_IMAGE", "localhost/agentstream:dev")
CONF = Path(os.environ.get("CONTAINERS_CONF") or ROOT / "infra" / "container" / "containers.conf")


@functools.cache
def _why_not(image: str) -> str | None:
    if shutil.which("podman") is None:
        return "podman is not installed (bash infra/container/build.sh installs it and builds the image)"
    if podman("image", "exists", image, conf=CONF, check=False).returncode != 0:
        return f"the image {image} is not built (bash infra/container/build.sh)"
    probe = podman("run", "--rm", "--network", "host", "--entrypoint", "true", image, conf=CONF, check=False,
                   timeout=120)
    if probe.returncode != 0:
        return f"podman cannot run containers here: {(probe.stderr or probe.stdout).strip()[-300:]}"
    return None


def require_image(image: str = IMAGE) -> str:
    """The image's name, or skip the test saying why podman cannot run it."""
    why = _why_not(image)
    if why is not None:
        pytest.skip(why)
    return image
