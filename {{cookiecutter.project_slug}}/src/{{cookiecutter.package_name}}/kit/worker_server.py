"""Imported by the loader workers' fork server (`ImageDataModule.worker_server` preloads it).

The server runs with SIGTERM blocked, so that a SIGTERM to the whole process group does not
end it; the processes it forks start as any other process does, with SIGTERM unblocked
(a loader worker then blocks it in `start_worker` and waits for its main process's).
"""

import os
import signal

os.register_at_fork(
    after_in_child=lambda: signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
)
