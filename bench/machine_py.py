"""The machine line's CPU for the Python benchmarks (bench/machine.c is the C side's)."""
import platform


def cpu_model():
    """/proc/cpuinfo's model name, else platform's processor, else "unknown"."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"
