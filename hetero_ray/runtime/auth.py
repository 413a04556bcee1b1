"""Ray 2.60 token authentication, from the client's side.

A cluster started with `ray start` has token auth on when a token file existed on the
head (cluster_configs/ scripts make sure of it). Clients that connect to an explicit
address must then say ``RAY_AUTH_MODE=token`` and hold the same token
(``~/.ray/auth_token``, or ``RAY_AUTH_TOKEN``). Ray reads that setting when it is
imported, so the CLI sets it first thing (:func:`prepare_auth_env`), before Ray loads.
No Ray import in this module.
"""

from __future__ import annotations

import os
from typing import Optional

TOKEN_FILE = os.path.expanduser("~/.ray/auth_token")


def prepare_auth_env(address: Optional[str]) -> bool:
    """Sets ``RAY_AUTH_MODE=token`` for an explicit address when a token is at hand.

    Returns True when it changed the environment. A user's own RAY_AUTH_MODE wins.
    """
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address is None or "RAY_AUTH_MODE" in os.environ:
        return False
    if os.path.exists(os.environ.get("RAY_AUTH_TOKEN_PATH") or TOKEN_FILE) or os.environ.get("RAY_AUTH_TOKEN"):
        os.environ["RAY_AUTH_MODE"] = "token"
        return True
    return False


def reload_ray_auth_config() -> None:
    """Makes an already imported Ray see a changed RAY_AUTH_MODE (Python API callers)."""
    try:
        from ray._raylet import AuthenticationTokenLoader, Config

        Config.initialize("")
        AuthenticationTokenLoader.instance().reset_cache()
    except Exception:  # noqa: BLE001 - private API; the CLI path never needs it
        pass
