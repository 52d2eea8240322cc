"""The confinement a sandboxed program runs under, applied by the child process to itself before it
executes the program: resource limits, a Landlock domain and a seccomp filter.

This file is run as a script by a fresh `python -I -S` (stdlib only, single-threaded: no torch thread
can hold a lock across the fork, which is why `subprocess`'s `preexec_fn` is not used). It reads one
JSON argument, confines itself, then replaces itself with the program (`os.execv`); every layer is
inherited across that exec and cannot be lifted by the program:

- **Landlock** (Linux >= 5.13, no privilege needed): the program reads and executes only the Python
  installation and the system's libraries, reads and writes only its scratch folder; with ABI >= 4 no
  TCP bind or connect, with ABI >= 6 no signal to a process outside the domain and no abstract socket.
- **seccomp**: no new process (fork, vfork, clone without CLONE_THREAD: threads stay allowed, a
  thread bomb is bounded by the address-space limit), no socket of any family, no io_uring (which
  would bypass the filter), no namespace, mount, ptrace, BPF or keyring call, and signals only to
  itself. Because nothing can fork, killing the one process on timeout leaves nothing behind.
- **rlimits**: CPU seconds, address space, file size, open files, no core dumps.

Exit code 97 (`JAIL_FAILED`) with one line on stderr means confinement itself failed: the caller
refuses rather than run the program unconfined.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import platform
import resource
import runpy
import select
import signal
import struct
import sys
import time
import traceback

JAIL_FAILED = 97

# Landlock UAPI (include/uapi/linux/landlock.h): syscall numbers are shared by x86_64 and aarch64.
_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_FS_EXECUTE, _FS_WRITE_FILE, _FS_READ_FILE, _FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_FS_ABI1 = (1 << 13) - 1  # execute .. make_sym
_FS_REFER, _FS_TRUNCATE, _FS_IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
_NET_BIND_TCP, _NET_CONNECT_TCP = 1 << 0, 1 << 1
_SCOPE_ABSTRACT_UNIX, _SCOPE_SIGNAL = 1 << 0, 1 << 1
_FILE_RIGHTS = _FS_EXECUTE | _FS_WRITE_FILE | _FS_READ_FILE | _FS_TRUNCATE | _FS_IOCTL_DEV
_READ_ONLY = _FS_EXECUTE | _FS_READ_FILE | _FS_READ_DIR

_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, _PR_SET_PDEATHSIG = 38, 22, 2, 1
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_CLONE_THREAD = 0x00010000
_RET_ALLOW, _RET_KILL_PROCESS, _RET_ERRNO = 0x7FFF0000, 0x80000000, 0x00050000
_LD_W_ABS, _JEQ_K, _JSET_K, _JGE_K, _RET_K = 0x20, 0x15, 0x45, 0x35, 0x06

# Syscall numbers per architecture (arch/x86/entry/syscalls/syscall_64.tbl, include/uapi/asm-generic/unistd.h).
_SYSCALLS = {
    "x86_64": {
        "clone": 56, "fork": 57, "vfork": 58, "clone3": 435, "socket": 41, "socketpair": 53, "ptrace": 101,
        "kill": 62, "tkill": 200, "tgkill": 234, "rt_sigqueueinfo": 129, "rt_tgsigqueueinfo": 297,
        "pidfd_send_signal": 424, "pidfd_open": 434, "pidfd_getfd": 438, "process_vm_readv": 310,
        "process_vm_writev": 311, "unshare": 272, "setns": 308, "mount": 165, "umount2": 166, "pivot_root": 155,
        "chroot": 161, "bpf": 321, "perf_event_open": 298, "userfaultfd": 323, "keyctl": 250, "add_key": 248,
        "request_key": 249, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
        "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsmount": 432,
    },
    "aarch64": {
        "clone": 220, "clone3": 435, "socket": 198, "socketpair": 199, "ptrace": 117, "kill": 129, "tkill": 130,
        "tgkill": 131, "rt_sigqueueinfo": 138, "rt_tgsigqueueinfo": 240, "pidfd_send_signal": 424,
        "pidfd_open": 434, "pidfd_getfd": 438, "process_vm_readv": 270, "process_vm_writev": 271,
        "unshare": 97, "setns": 268, "mount": 40, "umount2": 39, "pivot_root": 41, "chroot": 51, "bpf": 280,
        "perf_event_open": 241, "userfaultfd": 282, "keyctl": 219, "add_key": 217, "request_key": 218,
        "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "open_tree": 428,
        "move_mount": 429, "fsopen": 430, "fsmount": 432,
    },
}
_SIGNALS = ("kill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo")
_DENIED = ("fork", "vfork", "socket", "socketpair", "ptrace", "tkill", "pidfd_send_signal", "pidfd_open",
           "pidfd_getfd", "process_vm_readv", "process_vm_writev", "unshare", "setns", "mount", "umount2",
           "pivot_root", "chroot", "bpf", "perf_event_open", "userfaultfd", "keyctl", "add_key", "request_key",
           "io_uring_setup", "io_uring_enter", "io_uring_register", "open_tree", "move_mount", "fsopen", "fsmount")

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def landlock_abi() -> int:
    """The kernel's Landlock ABI version; 0 where Landlock is missing or disabled."""
    abi = _libc.syscall(ctypes.c_long(_SYS_CREATE_RULESET), None, ctypes.c_size_t(0),
                        ctypes.c_uint32(_CREATE_RULESET_VERSION))
    return max(int(abi), 0)


def _fail(message: str) -> None:
    sys.stderr.write(f"sandbox: {message}\n")
    sys.stderr.flush()
    os._exit(JAIL_FAILED)


def _landlock(abi: int, read_only: list[str], writable: list[str], files: list[str]) -> None:
    fs = _FS_ABI1 | (_FS_REFER if abi >= 2 else 0) | (_FS_TRUNCATE if abi >= 3 else 0) | (
        _FS_IOCTL_DEV if abi >= 5 else 0)
    net = (_NET_BIND_TCP | _NET_CONNECT_TCP) if abi >= 4 else 0
    scoped = (_SCOPE_ABSTRACT_UNIX | _SCOPE_SIGNAL) if abi >= 6 else 0
    attr = struct.pack("=QQQ", fs, net, scoped)[: 24 if abi >= 6 else 16 if abi >= 4 else 8]
    buf = ctypes.create_string_buffer(attr, len(attr))
    ruleset = _libc.syscall(ctypes.c_long(_SYS_CREATE_RULESET), buf, ctypes.c_size_t(len(attr)), ctypes.c_uint32(0))
    if ruleset < 0:
        _fail(f"landlock_create_ruleset failed: {os.strerror(ctypes.get_errno())}")
    rules = [(p, _READ_ONLY & fs) for p in read_only] + [(p, fs & ~_FS_IOCTL_DEV) for p in writable]
    rules += [(p, access & _FILE_RIGHTS & fs) for p, access in ((f, _FS_READ_FILE | _FS_WRITE_FILE)
                                                                 for f in files)]
    for path, access in rules:
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        if not os.path.isdir(path):
            access &= _FILE_RIGHTS
        rule = ctypes.create_string_buffer(struct.pack("=Qi", access, fd), 12)
        done = _libc.syscall(ctypes.c_long(_SYS_ADD_RULE), ctypes.c_int(ruleset), ctypes.c_int(_RULE_PATH_BENEATH),
                             rule, ctypes.c_uint32(0))
        os.close(fd)
        if done < 0:
            _fail(f"landlock_add_rule({path}) failed: {os.strerror(ctypes.get_errno())}")
    if _libc.syscall(ctypes.c_long(_SYS_RESTRICT_SELF), ctypes.c_int(ruleset), ctypes.c_uint32(0)) < 0:
        _fail(f"landlock_restrict_self failed: {os.strerror(ctypes.get_errno())}")
    os.close(ruleset)


def seccomp_program(machine: str, pid: int | None) -> list[tuple[int, int, int, int]]:
    """The classic-BPF filter (code, jt, jf, k) for `machine`: the denials of the module's docstring,
    signals allowed only to `pid`, any other architecture or x32 call killed. `pid` None is the pool's
    server (`serve`): it may fork its jobs and signal them, nothing else changes."""
    numbers = _SYSCALLS[machine]
    eperm, enosys = _RET_ERRNO | errno.EPERM, _RET_ERRNO | errno.ENOSYS
    prog = [(_LD_W_ABS, 0, 0, 4), (_JEQ_K, 1, 0, _AUDIT_ARCH[machine]), (_RET_K, 0, 0, _RET_KILL_PROCESS),
            (_LD_W_ABS, 0, 0, 0)]
    if machine == "x86_64":
        prog += [(_JGE_K, 0, 1, 0x40000000), (_RET_K, 0, 0, _RET_KILL_PROCESS)]
    server = pid is None
    for name in _DENIED:
        if name in numbers and not (server and name in ("fork", "vfork")):
            prog += [(_JEQ_K, 0, 1, numbers[name]), (_RET_K, 0, 0, eperm)]
    if server:
        prog += [(_JEQ_K, 0, 1, numbers["clone3"]), (_RET_K, 0, 0, enosys), (_RET_K, 0, 0, _RET_ALLOW)]
        return prog
    # glibc falls back from clone3 to clone on ENOSYS, where the flags can be read (clone3 passes a pointer)
    prog += [(_JEQ_K, 0, 1, numbers["clone3"]), (_RET_K, 0, 0, enosys)]
    prog += [(_JEQ_K, 0, 4, numbers["clone"]), (_LD_W_ABS, 0, 0, 16), (_JSET_K, 0, 1, _CLONE_THREAD),
             (_RET_K, 0, 0, _RET_ALLOW), (_RET_K, 0, 0, eperm)]
    for name in _SIGNALS:
        prog += [(_JEQ_K, 0, 4, numbers[name]), (_LD_W_ABS, 0, 0, 16), (_JEQ_K, 0, 1, pid),
                 (_RET_K, 0, 0, _RET_ALLOW), (_RET_K, 0, 0, eperm)]
    prog.append((_RET_K, 0, 0, _RET_ALLOW))
    return prog


def _seccomp(machine: str, pid: int | None) -> None:
    prog = seccomp_program(machine, pid)
    raw = b"".join(struct.pack("=HBBI", *ins) for ins in prog)
    filters = ctypes.create_string_buffer(raw, len(raw))

    class _Fprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = _Fprog(len(prog), ctypes.cast(filters, ctypes.c_void_p))
    if _libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        _fail(f"seccomp filter refused: {os.strerror(ctypes.get_errno())}")


def _limit(limits: dict) -> None:
    for name, value in (("RLIMIT_CPU", limits["cpu_s"]), ("RLIMIT_AS", limits["memory_bytes"]),
                        ("RLIMIT_FSIZE", limits["file_bytes"]), ("RLIMIT_NOFILE", limits["open_files"]),
                        ("RLIMIT_CORE", 0)):
        resource.setrlimit(getattr(resource, name), (value, value))


def confine(spec: dict, writable: str, pid: int | None) -> None:
    """This process under a Landlock domain (`spec`'s read-only paths, `writable` read-write) and the
    seccomp filter for `pid` (None: the pool's server)."""
    if _libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        _fail(f"no_new_privs refused: {os.strerror(ctypes.get_errno())}")
    abi = landlock_abi()
    if abi < 1:
        _fail("the kernel has no Landlock (Linux >= 5.13 with the landlock LSM enabled is needed)")
    _landlock(abi, spec["read_only"], [writable], spec["files"])
    machine = platform.machine()
    if machine not in _SYSCALLS:
        _fail(f"no seccomp filter for {machine} (x86_64 and aarch64 are supported)")
    _seccomp(machine, pid)


def _job(spec: dict, job: dict) -> None:
    """In the forked child: one job confined to its own folder (a nested Landlock domain: it cannot touch
    a sibling's files), its output to its log files, its script run as `__main__`; never returns."""
    code = 1
    try:
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        home = os.path.join(spec["root"], job["dir"])
        work = os.path.join(home, "work")
        for fd, name in ((1, "stdout"), (2, "stderr")):
            target = os.open(os.path.join(home, name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(target, fd)
            os.close(target)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.closerange(3, 65536)
        sys.stdin = open(0, closefd=False)  # noqa: SIM115
        sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
        os.chdir(work)
        _limit(job["limits"])
        confine(spec, work, os.getpid())
        sys.argv = list(job["argv"])
        sys.path.insert(0, work)
        try:
            runpy.run_path(job["argv"][0], run_name="__main__")
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:  # the job's own error: its traceback is its stderr
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code & 0xFF)


def _folder_too_big(folder: str, max_bytes: int, max_entries: int) -> bool:
    total = entries = 0
    stack = [folder]
    while stack:
        try:
            with os.scandir(stack.pop()) as it:
                for entry in it:
                    entries += 1
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
                    elif entry.is_file(follow_symlinks=False):
                        total += entry.stat(follow_symlinks=False).st_blocks * 512
                    if entries > max_entries or total > max_bytes:
                        return True
        except OSError:
            continue
    return False


def serve(spec: dict) -> None:
    """The pool's server: confined to the pool's root (Landlock) and the server filter, it reads one JSON
    job a line from stdin, runs up to `workers` at once, each in a forked child (no new interpreter: a job
    starts in about a millisecond), kills a job at its wall limit or when its folder grows past its
    limits, and writes one JSON result a line. End of input: it waits for the running jobs and exits."""
    confine(spec, spec["root"], None)
    out = sys.stdout
    out.write('{"ready": true}\n')
    out.flush()
    pending: list[dict] = []
    running: dict[int, tuple[dict, float]] = {}
    buffer, open_input = b"", True
    last_check = 0.0
    while open_input or pending or running:
        if open_input:
            ready, _, _ = select.select([0], [], [], 0.005 if running or pending else 0.5)
            if ready:
                chunk = os.read(0, 1 << 16)
                if not chunk:
                    open_input = False
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                pending += [json.loads(line) for line in lines if line.strip()]
        else:
            time.sleep(0.005)
        while pending and len(running) < spec["workers"]:
            job = pending.pop(0)
            pid = os.fork()
            if pid == 0:
                _job(spec, job)
            running[pid] = (job, time.monotonic())
        now = time.monotonic()
        check = now - last_check > 0.05
        last_check = now if check else last_check
        for pid, (job, start) in list(running.items()):
            done, status = os.waitpid(pid, os.WNOHANG)
            verdict = None
            if done:
                code = os.waitstatus_to_exitcode(status)
                verdict = {"status": "passed" if code == 0 else "killed" if code < 0 else "failed", "returncode": code}
            elif now - start > job["wall_s"]:
                verdict = {"status": "timeout"}
            elif check and _folder_too_big(os.path.join(spec["root"], job["dir"], "work"), job["scratch_bytes"],
                                           job["scratch_entries"]):
                verdict = {"status": "scratch"}
            if verdict is None:
                continue
            if not done:
                os.kill(pid, signal.SIGKILL)
                verdict["returncode"] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
            del running[pid]
            out.write(json.dumps({"id": job["id"], "seconds": time.monotonic() - start, **verdict}) + "\n")
            out.flush()


def main() -> None:
    spec = json.loads(sys.argv[1])
    if spec.get("serve"):
        serve(spec)
        return
    os.chdir(spec["scratch"])
    _limit(spec["limits"])
    confine(spec, spec["scratch"], os.getpid())
    argv = spec["argv"]
    try:
        os.execve(argv[0], argv, spec["env"])
    except OSError as exc:
        _fail(f"cannot execute {argv[0]}: {exc.strerror}")


if __name__ == "__main__":
    main()
