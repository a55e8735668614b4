"""The process's resident memory, for the per-rank memory benchmarks (bench/*_memory.py): a field
of /proc/self/status, and resetting its peak (VmHWM) to the current resident size."""


def status_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")
