"""The Ray engine: the only package that imports Ray.

Ray reads this variable when it is imported, so it is set here, before any module of the engine
can import Ray: it makes an embedded single-node cluster register itself on 127.0.0.1.
"""

import os

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
