"""host_pid.py NS_PID ANCESTOR: prints the host PID of the descendant of ANCESTOR that is
NS_PID in its own PID namespace (the innermost NSpid level), or nothing. `vgpu run`
gives its command a new PID namespace, so the PID a client reports is not the one
nvidia-smi outside lists."""
import os, sys

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


for entry in os.listdir("/proc"):
    if not entry.isdigit():
        continue
    try:
        status = open(f"/proc/{entry}/status").read()
    except OSError:
        continue
    levels = next((line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:")), [])
    if levels and levels[-1] == ns_pid and descends(int(entry)):
        print(entry)
        break
