"""Imported by the loaders' fork server only: `DataModule.worker_server` preloads it.

A SIGTERM to the whole process group (`kill -- -PGID`, `timeout`, a scheduler's time limit)
must not end the server: the main process learns from the server that a worker has ended, so
with the server gone it takes its running workers for ended and exits under them, and a worker
then fails to clean up in the main process's temporary folder, which is gone by then. The server
still ends when its main process does. Blocked, not ignored: a worker forked from here inherits
the block, keeps a SIGTERM that comes early, and `start_worker` acts on it.
"""

import signal

signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
