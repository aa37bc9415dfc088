"""Output a cell's subprocesses wrote: in the cell's own output, not lost after it.

Shipped into every kernel after ``_inkernel_patches.py``, into the same module (stdlib only).
With ``capture_fd_output``, ipykernel points file descriptors 1 and 2 at pipes and a thread
per pipe forwards what arrives (a subprocess's output, a C library's ``printf``) to the
cell's stdout or stderr. Nothing waits for that thread: when the cell ended before it had
passed the last bytes on (about 1 request in 200 that ran ``os.system('echo …')``, more on
a busy machine), they reached IOPub after the reply, under a request that was over, and
were lost. :func:`drain_fd_output` runs after each execution, before the kernel's last
flush, and waits until each pipe is empty and its thread is back to reading it.
"""

import array
import fcntl
import os
import sys
import time

_DRAIN_SECONDS = 0.5  # at most, per stream: a thread starved that long is left behind
_FIONREAD = 0x541B  # Linux, every architecture Python runs on


def drain_fd_output():
    for stream in (sys.stdout, sys.stderr):
        pipe = getattr(stream, "_fid", None)
        thread = getattr(stream, "watch_fd_thread", None)
        if pipe is None or thread is None or not getattr(stream, "_should_watch", False):
            continue
        deadline = None
        while thread.is_alive() and not _passed_on(pipe, stream, thread):
            now = time.monotonic()
            if deadline is None:
                deadline = now + _DRAIN_SECONDS
            elif now > deadline:
                break
            time.sleep(0.0002)  # the thread needs the GIL to pass the bytes on


def _passed_on(pipe, stream, thread):
    """Whether every byte written to ``pipe`` so far has been handed to ``stream``: the pipe
    is empty and the thread is blocked reading it (or echoing the last bytes it passed on
    to the original descriptor), not holding bytes it has read but not yet written."""
    try:
        pending = array.array("i", [0])
        fcntl.ioctl(pipe, _FIONREAD, pending)
        if pending[0]:
            return False
        fd = os.open(f"/proc/self/task/{thread.native_id}/syscall", os.O_RDONLY)
        try:
            fields = os.read(fd, 128).split()
        finally:
            os.close(fd)
    except (OSError, ValueError):
        return True  # cannot tell (not Linux, no /proc): as ipykernel itself, do not wait
    if len(fields) < 2 or fields[0] == b"running":
        return False
    try:
        first_argument = int(fields[1], 16)
    except ValueError:
        return True
    return first_argument in (pipe, getattr(stream, "_original_stdstream_copy", None))
