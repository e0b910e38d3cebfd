"""llama.cpp's ``llama-server`` (and ``llama-tokenize``), built once from the sources the ``llama-cpp-python``
sdist vendors.

The build is keyed by the sdist's sha256 and the cmake flags and lives outside any checkout
(``~/.cache/pytest-kvcache/llama.cpp/<key>/bin/llama-server``), so a second run, a fresh clone or another
worktree on the same machine finds it and costs nothing. ``llama-tokenize`` (the GGUF's own tokenizer, loading
the vocabulary only: the converter's tokenizer check compares against it) is a build of its own, keyed by
its target, so adding it left the server's key, and every cached server, as they were. Concurrent runs
(pytest-xdist workers, two CI jobs) serialise on a file lock: one builds, the others wait and reuse it. The
build runs under ``nice -n 19`` with two compile jobs; nothing is fetched but the sdist, through pip.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from pytest_kvcache.jsonio import file_sha256

#: The sdist whose ``vendor/llama.cpp`` is built, pinned by version and hash.
SDIST_PACKAGE = "llama-cpp-python"
SDIST_VERSION = "0.3.36"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
SDIST_NAME = f"llama_cpp_python-{SDIST_VERSION}.tar.gz"
#: Only the server: static libraries, no tests, examples, web UI download, curl or OpenSSL.
CMAKE_FLAGS: tuple[str, ...] = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DGGML_NATIVE=ON",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
)
TARGET = "llama-server"
#: llama.cpp's tools/tokenize: tokenizes a text with a GGUF's own vocabulary (``vocab_only``: no weights).
TOKENIZE_TARGET = "llama-tokenize"
#: Where the sdist may already be (``pip download`` output); ``KVCACHE_LLAMACPP_SDIST`` names a file.
SDIST_ENV = "KVCACHE_LLAMACPP_SDIST"
JOBS_ENV = "KVCACHE_BUILD_JOBS"


class BuildError(RuntimeError):
    """llama-server (or llama-tokenize) could not be built; the message says which step failed and ends with
    its output."""


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path("~/.cache").expanduser())
    return Path(base) / "pytest-kvcache" / "llama.cpp"


def build_key(target: str = TARGET) -> str:
    """sha256 of what decides the binary: the sources (the sdist's hash), the flags, the target and the
    machine."""
    text = "\n".join((SDIST_SHA256, *CMAKE_FLAGS, target, platform.machine(), platform.system()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cached_binary(target: str, root: Path | None = None) -> Path | None:
    """The built ``target`` when its key's build has completed, else None."""
    path = (root or cache_root()) / build_key(target) / "bin" / target
    return path if path.is_file() and os.access(path, os.X_OK) else None


def cached_server(root: Path | None = None) -> Path | None:
    """The built ``llama-server`` when this key's build has completed, else None."""
    return cached_binary(TARGET, root)


def cached_tokenize(root: Path | None = None) -> Path | None:
    """The built ``llama-tokenize`` when its build has completed, else None."""
    return cached_binary(TOKENIZE_TARGET, root)


def _run(argv: list[str], *, cwd: Path | None, log: Path, what: str) -> None:
    with log.open("ab") as out:
        out.write(f"$ {' '.join(argv)}\n".encode())
        out.flush()
        code = subprocess.call(argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    if code != 0:
        lines = log.read_text(encoding="utf-8", errors="replace").splitlines()[-30:]
        raise BuildError(f"{what} failed (exit {code}); full log: {log}\n" + "\n".join(lines))


def find_sdist(root: Path, log: Path) -> Path:
    """The pinned sdist: ``$KVCACHE_LLAMACPP_SDIST``, the cache's copy, else ``pip download`` (hash-checked)."""
    candidates = [Path(p) for p in [os.environ.get(SDIST_ENV)] if p] + [root / "sdist" / SDIST_NAME]
    for path in candidates:
        if path.is_file():
            if file_sha256(path) != SDIST_SHA256:
                raise BuildError(f"{path}: sha256 is not the pinned {SDIST_PACKAGE} {SDIST_VERSION} sdist's")
            return path
    target = root / "sdist"
    target.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-d", str(target)]
    _run([*argv, f"{SDIST_PACKAGE}=={SDIST_VERSION}"], cwd=None, log=log, what=f"pip download {SDIST_PACKAGE}")
    path = target / SDIST_NAME
    if not path.is_file() or file_sha256(path) != SDIST_SHA256:
        raise BuildError(f"pip download gave no {SDIST_NAME} with the pinned sha256 in {target}")
    return path


def _extract_vendor(sdist: Path, dest: Path) -> Path:
    prefix = f"llama_cpp_python-{SDIST_VERSION}/vendor/llama.cpp/"
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
        if not members:
            raise BuildError(f"{sdist} vendors no llama.cpp sources ({prefix})")
        tar.extractall(dest, members=members, filter="data")
    return dest / prefix


def ensure_server(root: Path | None = None, *, on_build: Callable[[str], None] | None = None) -> Path:
    """The cached ``llama-server``, building it first when missing. Raises BuildError."""
    return ensure_binary(TARGET, root, on_build=on_build)


def ensure_tokenize(root: Path | None = None, *, on_build: Callable[[str], None] | None = None) -> Path:
    """The cached ``llama-tokenize``, building it first when missing (about 9 minutes on 2 cores, once).
    Raises BuildError."""
    return ensure_binary(TOKENIZE_TARGET, root, on_build=on_build)


def ensure_binary(target: str, root: Path | None = None, *, on_build: Callable[[str], None] | None = None) -> Path:
    """The cached ``target`` (``llama-server`` or ``llama-tokenize``), building it first when missing."""
    root = root or cache_root()
    if found := cached_binary(target, root):
        return found
    if shutil.which("cmake") is None or shutil.which(os.environ.get("CXX", "c++")) is None:
        why = " (or give --kv-engine-cmd)" if target == TARGET else ""
        raise BuildError(f"building {target} needs cmake and a C++ compiler on PATH{why}")
    root.mkdir(parents=True, exist_ok=True)
    key = build_key(target)
    with (root / f"{key}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another run building the same key: wait, then reuse its result
        if found := cached_binary(target, root):
            return found
        if on_build is not None:
            on_build(f"building {target} (llama.cpp from {SDIST_PACKAGE} {SDIST_VERSION}) into {root / key}")
        log = root / f"{key}.build.log"
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        log.write_text(f"# build of {target}, key {key}, started {stamp}\n")
        started = time.monotonic()
        sdist = find_sdist(root, log)
        n = int(os.environ.get(JOBS_ENV) or 0) or min(2, os.cpu_count() or 1)
        nice = ["nice", "-n", "19"] if shutil.which("nice") else []
        with tempfile.TemporaryDirectory(prefix=f"{key}.", dir=root) as tmp:
            source = _extract_vendor(sdist, Path(tmp))
            build = Path(tmp) / "build"
            _run([*nice, "cmake", "-S", str(source), "-B", str(build), *CMAKE_FLAGS], cwd=None, log=log, what="cmake")
            _run(
                [*nice, "cmake", "--build", str(build), "--target", target, "-j", str(n)],
                cwd=None,
                log=log,
                what=f"building {target}",
            )
            built = build / "bin" / target
            if not built.is_file():
                raise BuildError(f"the build finished without {built}; full log: {log}")
            staged = Path(tmp) / "out"
            (staged / "bin").mkdir(parents=True)
            shutil.copy2(built, staged / "bin" / target)
            (staged / "BUILD").write_text(
                f"{SDIST_PACKAGE} {SDIST_VERSION} sha256 {SDIST_SHA256}\n{' '.join(CMAKE_FLAGS)}\n"
                f"built in {time.monotonic() - started:.0f} s with {n} jobs\n"
            )
            final = root / key
            if final.exists():
                shutil.rmtree(final)  # an interrupted earlier attempt
            staged.rename(final)  # atomic: a half-built folder is never taken for a build
        with log.open("a") as fh:
            fh.write(f"# done in {time.monotonic() - started:.0f} s\n")
        found = cached_binary(target, root)
        assert found is not None
        return found


def main(argv: list[str] | None = None) -> int:
    """``python -m pytest_kvcache.engines.llamacpp_build [llama-tokenize]``: build (or find) llama-server (or
    llama-tokenize), print its path."""
    args = sys.argv[1:] if argv is None else argv
    targets = (TARGET, TOKENIZE_TARGET)
    if len(args) > 1 or (args and args[0] not in targets):
        print(f"usage: python -m pytest_kvcache.engines.llamacpp_build [{' | '.join(targets)}]", file=sys.stderr)
        return 2
    started = time.monotonic()
    try:
        path = ensure_binary(args[0] if args else TARGET, on_build=lambda msg: print(msg, file=sys.stderr, flush=True))
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(path)
    print(f"({time.monotonic() - started:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
