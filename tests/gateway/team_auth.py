"""Per-user keys for the test's litellm proxy: the proxy imports this module (`custom_auth` in its
config). A key maps to a user; anything else is refused with 401. A team without a database for the
proxy's own virtual keys can run this as it is, with its users' keys in MFS_GATEWAY_KEYS
("key=user,key=user"); with the proxy's database, its virtual keys and budgets replace it."""

from __future__ import annotations

import os

from fastapi import HTTPException, Request
from litellm.proxy._types import UserAPIKeyAuth


def _keys() -> dict[str, str]:
    pairs = (item.split("=", 1) for item in os.environ.get("MFS_GATEWAY_KEYS", "").split(",") if "=" in item)
    return {key.strip(): user.strip() for key, user in pairs}


async def user_api_key_auth(request: Request, api_key: str) -> UserAPIKeyAuth:
    user = _keys().get(api_key.removeprefix("Bearer ").strip())
    if user is None:
        raise HTTPException(status_code=401, detail="unknown key")
    return UserAPIKeyAuth(api_key=api_key, user_id=user)
