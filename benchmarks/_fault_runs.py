"""What benchmarks/faults.py runs the `hir` command with: a real process per run, its output,
a SIGKILL at a chosen moment of a stage, the one error line an operator sees, and a small
filesystem (tmpfs) to fill."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HIR = Path(sys.executable).with_name("hir")
# one thread: a resumed training must end bit for bit where an uninterrupted one ends
ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
       "TOKENIZERS_PARALLELISM": "false"}


@dataclass
class Run:
    rc: int
    out: str
    seconds: float

    @property
    def errors(self) -> list[str]:
        """The ERROR lines hir logged (what the operator reads)."""
        return [ln for ln in self.out.splitlines() if "[ERROR]" in ln or ln.startswith("hir: ")]

    @property
    def traceback(self) -> bool:
        return "Traceback (most recent call last)" in self.out

    def one_line(self) -> str | None:
        """The single error line of a clean refusal (exit 2, one ERROR line, no traceback), else None."""
        errs = self.errors
        if self.rc == 2 and len(errs) == 1 and not self.traceback:
            return message(errs[0])
        return None

    def stage_seconds(self, stage: str) -> float | None:
        m = re.search(rf"stage {stage}: done in ([0-9.]+)s", self.out)
        return float(m.group(1)) if m else None


def message(line: str) -> str:
    """A log line without its ``[time][logger][LEVEL]`` prefix."""
    return re.sub(r"^\[[^\]]*\]\[[^\]]*\]\[\w+\] ", "", line.strip())


def hir(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: int = 1200) -> Run:
    """`hir <args>` in a process of its own; stdout and stderr together."""
    t0 = time.perf_counter()
    proc = subprocess.run([str(HIR), *args], cwd=cwd, env={**os.environ, **ENV, **(env or {})}, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
    return Run(proc.returncode, proc.stdout, time.perf_counter() - t0)


def hir_killed(*args: str, cwd: Path, stage: str, after_s: float, env: dict[str, str] | None = None,
               timeout: int = 1200, marker: str | None = None) -> tuple[Run, bool]:
    """`hir <args>`, sent SIGKILL ``after_s`` seconds after it logs ``marker`` (default
    ``stage <stage>: start``; its imports and config take seconds that are no point of the stage). Returns the run and
    whether the kill landed (False when the stage finished first)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([str(HIR), *args], cwd=cwd, env={**os.environ, **ENV, **(env or {})}, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    lines: list[str] = []
    started = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if (marker or f"stage {stage}: start") in line:
                started.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    killed = False
    if started.wait(timeout):
        time.sleep(after_s)
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)  # the process this function started, by its pid
            killed = True
    proc.wait(timeout=timeout)
    reader.join(timeout=10)
    return Run(proc.returncode, "".join(lines), time.perf_counter() - t0), killed


def du(path: Path) -> int:
    """Bytes of the files under ``path``."""
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file() and not p.is_symlink())


class Tmpfs:
    """A tmpfs of a given size mounted at ``path`` (needs root); resizable; unmounted on exit."""

    def __init__(self, path: Path, size_bytes: int) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={self._kib(size_bytes)}k", "tmpfs", str(self.path)],
                       check=True, capture_output=True)

    @staticmethod
    def _kib(n: int) -> int:
        return max(4, (int(n) + 4095) // 4096 * 4)

    def resize(self, size_bytes: int) -> None:
        subprocess.run(["mount", "-o", f"remount,size={self._kib(size_bytes)}k", str(self.path)], check=True,
                       capture_output=True)

    def used(self) -> int:
        return shutil.disk_usage(self.path).used

    def close(self) -> None:
        """Unmount; when this process still holds a file there (a Feast SQLite connection the
        checks opened), detach it lazily so no mount outlives the run."""
        if subprocess.run(["umount", str(self.path)], check=False, capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(self.path)], check=False, capture_output=True)

    def __enter__(self) -> Tmpfs:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @staticmethod
    def available(probe: Path) -> bool:
        """Whether this machine lets us mount a tmpfs (root, and the kernel allows it)."""
        if os.geteuid() != 0:
            return False
        try:
            t = Tmpfs(probe, 1 << 20)
        except (subprocess.CalledProcessError, OSError):
            return False
        t.close()
        return True
