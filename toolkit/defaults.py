"""The defaults a user sees in `--help`, in one module that imports nothing.

The CLI reads them for every command, a refused argument included, so they must not pull
in SQLAlchemy or a driver; the library modules that apply them import them from here.
"""

from __future__ import annotations

DEFAULT_MAX_PAYLOAD_BYTES = 1024 * 1024  # the largest payload enqueue accepts, unless install says otherwise
INSTALL_LOCK_WAIT_S = 60.0  # how long install, upgrade and uninstall wait for one another by default
RETRY_TOTAL_S = 30.0  # how long a client keeps reconnecting after a lost connection before it gives up
DEFAULT_POLL_INTERVAL = 2.0  # longest wait between a worker's looks at an idle queue
DEFAULT_LOG_INTERVAL = 10.0  # seconds between a worker's throughput log lines
