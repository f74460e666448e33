"""mmgate's Python client, for internal services: ``MmgateClient`` (asyncio) and ``SyncClient``.

    async with MmgateClient("127.0.0.1:50051") as client:
        async for text in client.stream_text("What is the capital of France?", max_tokens=32):
            print(text, end="")
        answer = await client.complete("Name a prime.", temperature=0.0)

    with SyncClient("127.0.0.1:50051") as client:  # the same calls, blocking
        answer = client.complete("Name a prime.", temperature=0.0)

A string is sent as one user turn of a chat (the model's chat template applies); pass
``messages=[("system", ...), ("user", ...)]`` for more turns, or ``raw=True`` to send the string
to the model as is.

Images go as bytes (PNG, JPEG, WebP): ``complete("<image> What is this?", images=[png])``; the
n-th ``<image>`` in the text is the n-th image (with none in the text, they go before the user's
text). Once the server has reported an image's digest, this client sends only the digest; if
the server no longer holds it (NOT_FOUND, reason IMAGE_NOT_FOUND), the client resends the
request with the bytes, once:

    request ── by_reference ──┬── an image held ──► sent by digest ──► NOT_FOUND, IMAGE_NOT_FOUND
                              │                                                │ forget the digests
                              └── none held ──────► sent as built ◄────────────┘ (once)

Tools: a Python function is a tool (its signature the parameters' schema); an answer's calls
come back per sample, each checked against its function's schema, and go back with their
results for the model's next turn:

    answer = await client.complete("Weather in Oslo?", tools=[get_weather], tool_choice="required")
    calls = answer.choices[0].end.tool_calls
    results = [tool_result(c.id, get_weather(**json.loads(c.arguments))) for c in calls]
    final = await client.complete(
        messages=[("user", "Weather in Oslo?"), calls_turn(calls), *results], tools=[get_weather]
    )

Credentials (docs/security.md, docs/clients.md): a bearer token, TLS with the server's CA, a
client certificate:

    creds = Credentials(token=os.environ["MMGATE_TOKEN"], tls_ca="ca.crt")
    async with MmgateClient("mmgate.ml:50051", credentials=creds) as client: ...

This package imports grpc, protobuf, the generated stubs and ``wire`` only: a service that only
calls mmgate loads none of the server's dependencies (a test holds it to that).
"""

from .aio import MmgateClient
from .credentials import Credentials
from .requests import (
    CACHE_POLICIES,
    DEFAULT_TARGET,
    HELD_DIGESTS,
    HeldImages,
    build_request,
    digest_of,
    error_reason,
    image_not_found,
)
from .sync import SyncClient
from .tools import as_tool, calls_turn, tool_choice, tool_from_function, tool_result

__all__ = [
    "CACHE_POLICIES",
    "DEFAULT_TARGET",
    "HELD_DIGESTS",
    "Credentials",
    "HeldImages",
    "MmgateClient",
    "SyncClient",
    "as_tool",
    "build_request",
    "calls_turn",
    "digest_of",
    "error_reason",
    "image_not_found",
    "tool_choice",
    "tool_from_function",
    "tool_result",
]
