"""Whether the Hugging Face Hub can be reached from here: switched off, its address, a connection tried in seconds.

A `hf:NAME` source asks before it loads anything, so a closed network is one line at once rather
than the Hugging Face client's retries.
"""

from __future__ import annotations

import os
import socket
import threading
import urllib.parse
import urllib.request

TIMEOUT_S = 5.0


def offline() -> bool:
    truthy = {"1", "on", "yes", "true"}
    return any(os.environ.get(v, "").strip().lower() in truthy for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


def address() -> tuple[str, int]:
    url = urllib.parse.urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    return url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)


def host() -> str:
    return address()[0]


def reachable() -> bool:
    """Whether a TCP connection to the hub opens within TIMEOUT_S (name lookup included).

    Behind a proxy the check cannot tell, and says yes: the Hugging Face client's own timeouts apply.
    """
    if urllib.request.getproxies().get("https"):
        return True
    outcome: list[bool] = []

    def connect() -> None:
        try:
            socket.create_connection(address(), timeout=TIMEOUT_S).close()
            outcome.append(True)
        except OSError:
            outcome.append(False)

    thread = threading.Thread(target=connect, daemon=True)  # a name lookup ignores the socket's timeout
    thread.start()
    thread.join(TIMEOUT_S)
    return bool(outcome and outcome[0])
