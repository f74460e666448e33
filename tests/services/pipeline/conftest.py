"""The pipeline's tests reach into a server in this process: the session's (tests/services/
in_process.py), the tiny LLaVA in embeddings mode. Each test asks with images of its own seeds,
and counts are deltas.
"""

from __future__ import annotations

import pytest

from services.api.server import MmgateServer

from ..in_process import InProcess


@pytest.fixture(scope="session")
def embeddings_server(llava_in_process: InProcess) -> MmgateServer:
    return llava_in_process.server
