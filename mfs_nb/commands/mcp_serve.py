"""`mfs-nb mcp`: the server run over stdio or streamable HTTP, an HTTP request checked for its bearer
token (needed off loopback)."""

from __future__ import annotations

import hmac
import os
from typing import Any

from ..errors import InputError
from .mcp_server import LOOPBACK, TOKEN_ENV, Memory, build


def check_token(host: str) -> str | None:
    """The bearer token HTTP requests must carry (None: none needed, loopback without MFS_MCP_TOKEN set)."""
    token = os.environ.get(TOKEN_ENV) or None
    if token is None and host not in LOOPBACK:
        raise InputError(f"serving on {host} needs a bearer token: set {TOKEN_ENV} in the environment "
                         "(clients send it as 'Authorization: Bearer …')")
    return token


class Bearer:
    """ASGI wrapper: an HTTP request without `Authorization: Bearer <token>` gets 401 and nothing else."""

    def __init__(self, app: Any, token: str):
        self.app = app
        self.expected = f"Bearer {token}".encode()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            given = dict(scope.get("headers") or ()).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                await send({"type": "http.response.start", "status": 401,
                            "headers": [(b"content-type", b"text/plain"), (b"www-authenticate", b"Bearer")]})
                await send({"type": "http.response.body", "body": b"unauthorized\n"})
                return
        await self.app(scope, receive, send)


def http_app(server: Any, host: str, token: str | None) -> Any:
    from mcp.server.transport_security import TransportSecuritySettings

    # behind a token, the Host check that guards a loopback server from DNS rebinding is not needed
    security = None if host in LOOPBACK else TransportSecuritySettings(enable_dns_rebinding_protection=False)
    app = server.streamable_http_app(host=host, transport_security=security)
    return Bearer(app, token) if token else app


def serve(store_uri: str | None, transport: str = "stdio", host: str = "127.0.0.1", port: int = 8765,
          allow_writes: bool = False) -> int:
    """Run the server until its client goes away (stdio) or it is interrupted (HTTP)."""
    try:
        import mcp  # noqa: F401
    except ImportError:
        raise InputError("the MCP server needs the mcp package: pip install 'mfs_nb[mcp]'") from None
    from .importer import open_store

    token = check_token(host) if transport == "http" else None
    os.environ.setdefault("MFS_WARM", "0")  # nothing loads ahead of use: the server may only ever list sessions
    memory = Memory(open_store(store_uri, create=False), allow_writes)
    server = build(memory)
    try:
        if transport == "stdio":
            server.run("stdio")
        else:
            import anyio
            import uvicorn

            config = uvicorn.Config(http_app(server, host, token), host=host, port=port, log_level="warning")
            anyio.run(uvicorn.Server(config).serve)
    finally:
        memory.close()
