"""host_pid.py NS_PID ANCESTOR: prints the host PID of the descendant of ANCESTOR that is
NS_PID in its own PID namespace (the innermost NSpid level), or nothing. `vgpu run`
gives its command a new PID namespace, so the PID a client reports is not the one
nvidia-smi outside lists.

host_pid.py --argv PROGRAM ARG... ANCESTOR: the same, for the descendant whose program
ends with PROGRAM and whose arguments include every ARG (a container's PID 1 is not
its workload)."""
import os, sys

if sys.argv[1] == "--argv":
    program, words, ancestor = sys.argv[2].encode(), [w.encode() for w in sys.argv[3:-1]], int(sys.argv[-1])
    ns_pid = None
else:
    ns_pid, ancestor = sys.argv[1].strip(), int(sys.argv[2])


def parent(pid):
    try:
        stat = open(f"/proc/{pid}/stat").read()
        return int(stat[stat.rindex(")") + 2:].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def descends(pid):
    while pid > 1:
        if pid == ancestor:
            return True
        pid = parent(pid)
    return False


def matches(entry):
    try:
        if ns_pid is None:
            argv = open(f"/proc/{entry}/cmdline", "rb").read().split(b"\0")
            return argv[0].endswith(program) and all(word in argv[1:] for word in words)
        status = open(f"/proc/{entry}/status").read()
    except OSError:
        return False
    levels = next((line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:")), [])
    return bool(levels) and levels[-1] == ns_pid


for entry in os.listdir("/proc"):
    if entry.isdigit() and matches(entry) and descends(int(entry)):
        print(entry)
        break
