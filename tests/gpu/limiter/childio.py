"""What the limiter's coordinators (pairs.py, interleave.py) share about their children:
the whole lines a child wrote into a non-blocking pipe, and a state file written whole,
so that a reader, or a coordinator killed mid-way, finds the old file or the new one.
"""
import json
import os


class Lines:
    """Whole lines from a non-blocking file descriptor (a pipe or a FIFO's read end)."""

    def __init__(self, fd):
        self.fd = fd
        self.pending = b""

    def read(self):
        """The whole lines written since the last call (one read of at most 64 KiB; a
        partial last line waits for the rest), and whether the writer's end closed."""
        ended = False
        try:
            data = os.read(self.fd, 65536)
            ended = not data
            self.pending += data
        except BlockingIOError:
            pass
        *whole, self.pending = self.pending.split(b"\n")
        return [line.decode(errors="replace") for line in whole], ended


def write_whole(path, value):
    """Writes VALUE to PATH as indented JSON, through PATH.new and a rename."""
    with open(path + ".new", "w") as f:
        json.dump(value, f, indent=1)
    os.replace(path + ".new", path)
