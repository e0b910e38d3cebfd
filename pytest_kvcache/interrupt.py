"""A run's interrupt state, for the layers that must react to Ctrl-C (or SIGTERM) without the plugin.

Python turns SIGINT into a KeyboardInterrupt at the next bytecode of the main thread. When that bytecode is
inside a finalizer (an ``__del__``, a generator closed by the garbage collector: http.client, urllib3 and
sockets all have them) the exception is printed as "Exception ignored in …" and lost: the run goes on as if
nothing happened, to its last request. So the plugin's SIGINT handler also sets :data:`INTERRUPTED`, and the
measuring loops call :func:`check` before each request: an interrupt is never lost for longer than one
request. Plain Python; no pytest.
"""

from __future__ import annotations

import threading
from types import FrameType

#: Set by the plugin's SIGINT handler (and its SIGTERM handler) once the run is interrupted. Cleared per session.
INTERRUPTED = threading.Event()
#: Set by a further Ctrl-C while an interrupted run winds down (the plugin's SIGINT handler raises no second
#: KeyboardInterrupt then): a stop waiting out its SIGTERM grace kills the engine at once. Cleared per session.
HURRY = threading.Event()
#: After Ctrl-C (or SIGTERM) an engine gets this long to exit on SIGTERM before it is killed.
INTERRUPT_GRACE_S = 2.0


def on_sigint(signum: int, frame: FrameType | None) -> None:
    """SIGINT while the run measures: note it, then unwind as Python's own handler does."""
    INTERRUPTED.set()
    raise KeyboardInterrupt


def check() -> None:
    """Raise KeyboardInterrupt when the run was interrupted and the first one was lost in a finalizer."""
    if INTERRUPTED.is_set():
        raise KeyboardInterrupt("interrupted (Ctrl-C or SIGTERM)")


def clear() -> None:
    """A new session: no interrupt yet."""
    INTERRUPTED.clear()
    HURRY.clear()
