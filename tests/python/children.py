"""What the Python tests share about child processes: one blocked in a
call, interrupted by SIGINT as Ctrl-C does."""

import signal
import subprocess
import sys
import time


def _asleep(pid):
    """Whether the main thread of process pid sleeps (blocked in a call)."""
    with open(f"/proc/{pid}/task/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] == "S"


def interrupted(script):
    """Runs script in a child Python, which prints "waiting" before its
    blocking call; once its main thread sleeps in that call, sends it SIGINT.
    Returns (seconds from SIGINT to the child's exit, its stderr)."""
    # Python raises KeyboardInterrupt only where SIGINT was not ignored when
    # it started (a runner in the background may ignore it): as at a shell.
    script = "import signal\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n" + script
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "waiting", child.stderr.read()
        deadline = time.monotonic() + 10
        while not _asleep(child.pid):  # printed, flushed: next is the blocking call
            assert time.monotonic() < deadline, "the child never blocked"
            time.sleep(0.01)
        sent = time.monotonic()
        child.send_signal(signal.SIGINT)
        _, stderr = child.communicate(timeout=15)
        return time.monotonic() - sent, stderr
    finally:
        child.kill()
