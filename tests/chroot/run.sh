#!/usr/bin/env bash
# Runs shmvec's core test suite under a Python other than the host's, in a Debian root filesystem
# entered with chroot:
#
#   bash tests/chroot/run.sh arm64           # aarch64 Python 3.11 (bookworm), QEMU user-mode emulation
#   bash tests/chroot/run.sh py313           # Python 3.13 (trixie), native
#   bash tests/chroot/run.sh py314           # Python 3.14 (sid), native: its start method is forkserver
#   bash tests/chroot/run.sh py314 -k gae -x # extra arguments go to pytest, after the core files
#   bash tests/chroot/run.sh arm64 tests/test_gae.py::test_kernels_are_cached_on_disk
#                                            # an argument under tests/ replaces the core files
#   bash tests/chroot/run.sh py314 --python benchmarks/start_methods.py --json /results/start_methods-py314.json
#                                            # a script instead of pytest; /results is the host's
#                                            # benchmarks/results-2core, writable
#
# (make test-arm64, make test-py313, make test-py314; make test-pythons runs the last two.)
# Python 3.12 is in no Debian release (bookworm has 3.11, trixie 3.13, sid 3.14): no target claims it.
#
# Everything installs itself on a fresh Debian/Ubuntu machine (needs root, or sudo) and is built once
# per target under .chroots/<target>/ at the repository root (git-ignored): the apt packages
# (debootstrap; for arm64 qemu-user-static and binfmt-support), the root filesystem, the target's
# wheels of tests/chroot/requirements.txt (downloaded on the host: pip inside the root is not
# trusted with TLS) and a venv inside the root. A second run reuses all of it; editing
# requirements.txt re-downloads the wheels and rebuilds the venv. `rm -rf .chroots/<target>` starts over.
#
# Each run copies the current working tree (tracked and untracked, not ignored, files) into the
# chroot's /src, so the tests never write into the checkout, and exits with pytest's status.
#
# Environment: CHROOT_BUILD_DIR (default <repo>/.chroots/<target>), CHROOT_MIRROR (default: the
# Debian mirror apt is configured with).
set -euo pipefail

if [[ ${EUID:-$(id -u)} -ne 0 ]]; then
    if command -v sudo >/dev/null 2>&1; then
        exec sudo -E bash "${BASH_SOURCE[0]}" "$@"
    fi
    echo "run.sh: needs root (chroot, mount, binfmt_misc) and sudo is not installed" >&2
    exit 2
fi

TARGET=${1:-}
shift || true
HOST_ARCH=$(dpkg --print-architecture 2>/dev/null || uname -m)
case $HOST_ARCH in x86_64) HOST_ARCH=amd64 ;; aarch64) HOST_ARCH=arm64 ;; esac
# Each target: its Debian architecture and suite, the Python packages and executable in it, the
# Python version its wheels are for, and whether it runs emulated.
case $TARGET in
    arm64) ARCH=arm64 SUITE=bookworm PY=python3 PYPKGS=python3,python3-venv PYVER=3.11 ;;
    py313) ARCH=$HOST_ARCH SUITE=trixie PY=python3.13 PYPKGS=python3.13,python3.13-venv PYVER=3.13 ;;
    py314) ARCH=$HOST_ARCH SUITE=sid PY=python3.14 PYPKGS=python3.14,python3.14-venv PYVER=3.14 ;;
    *)
        echo "usage: run.sh arm64|py313|py314 [pytest arguments]" >&2
        exit 2
        ;;
esac
EMULATED=0
[[ $ARCH != "$HOST_ARCH" ]] && EMULATED=1
case $ARCH in
    amd64) WHEEL_PLATFORMS=(manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 linux_x86_64) MACHINE=x86_64 ;;
    arm64) WHEEL_PLATFORMS=(manylinux_2_28_aarch64 manylinux_2_17_aarch64 manylinux2014_aarch64 linux_aarch64) MACHINE=aarch64 ;;
esac

START=$SECONDS
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
BUILD=${CHROOT_BUILD_DIR:-$REPO/.chroots/$TARGET}
ROOTFS=$BUILD/rootfs
WHEELS=$BUILD/wheels
REQ=$HERE/requirements.txt
VENV=/opt/venv               # inside the root filesystem
REQ_HASH=$(sha256sum "$REQ" | cut -d' ' -f1)

# The core suite. test_async, test_faults, ... start worker processes and talk to them through
# shared memory (/dev/shm) and futex-style waits; test_gae compiles the Numba kernels for aarch64.
CORE_TESTS=(
    tests/test_equivalence.py tests/test_faults.py tests/test_async.py tests/test_rollout.py
    tests/test_gae.py tests/test_snapshots.py tests/test_sync.py tests/test_layout.py
    tests/test_segment.py tests/test_barrier.py
)
# Natively, also what the start-method policy and the main guard do under that Python's defaults.
# (Under QEMU's user mode the emulator's own thread is one of the process's: the default then
# starts every worker from the forkserver, and these tests' expectations of a caller alone fail.)
((EMULATED)) || CORE_TESTS+=(tests/test_start_methods.py tests/test_main_guard.py)

# Deselected (every other test of the files runs):
# - the "sb3" cases of test_faults import shmvec.sb3, i.e. stable_baselines3 and so torch: torch
#   is a ~100 MB+ wheel whose import alone takes minutes under emulation, and the SB3 adapter has no
#   aarch64-specific code (the "make" and "baselines" cases of the same tests drive the same
#   ShmVecEnv). Without torch they would only be skipped by pytest.importorskip.
# - under emulation only, the "memory" fault of test_faults' death suite (3 start methods x
#   raise/restart): an emulation limit, not a shmvec bug, and unsafe to run here. FaultyEnv("memory") caps its worker's address
#   space with setrlimit(RLIMIT_AS) and then allocates without bound, expecting a MemoryError after
#   4 x 32 MiB. QEMU user mode accepts setrlimit(RLIMIT_AS/RLIMIT_DATA/RLIMIT_STACK) but does not
#   apply it (it would bind QEMU's own allocations; getrlimit then reads unlimited), so the worker
#   grew to the machine's whole memory (23 GB) until the kernel's OOM killer sent SIGKILL: the tests
#   saw WorkerDied(SIGKILL) instead of WorkerError(MemoryError), after 30-60 s instead of < 2 s,
#   and the real OOM killer, which may pick any process on the machine, fired six times.
#   (The "oom_kill" fault stays below its cap by itself, never needs the limit, and runs.)
DESELECT=(
    "tests/test_faults.py::test_deaths_through_every_entry_point[sb3-segfault-raise]"
    "tests/test_faults.py::test_deaths_through_every_entry_point[sb3-exit-restart]"
    "tests/test_faults.py::test_no_env_runs_in_the_calling_process_by_default[sb3]"
)
((EMULATED)) && DESELECT+=(
    "tests/test_faults.py::test_every_death_raises_a_clear_error_and_closes[memory-fork]"
    "tests/test_faults.py::test_every_death_raises_a_clear_error_and_closes[memory-forkserver]"
    "tests/test_faults.py::test_every_death_raises_a_clear_error_and_closes[memory-spawn]"
    "tests/test_faults.py::test_every_death_restarts_its_worker[memory-fork]"
    "tests/test_faults.py::test_every_death_restarts_its_worker[memory-forkserver]"
    "tests/test_faults.py::test_every_death_restarts_its_worker[memory-spawn]"
)

log() { printf '\n== %s: %s\n' "$TARGET" "$*"; }

# ---------------------------------------------------------------------------------------- mounts
MOUNTED=()
mounts_under() {  # mount points at or below $1, deepest first
    awk -v root="$1" '{ gsub(/\\040/, " ", $2); if ($2 == root || index($2, root "/") == 1) print $2 }' \
        /proc/self/mounts | sort -r
}
unmount_all_under() {
    local m
    while read -r m; do
        [[ -n $m ]] || continue
        umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || echo "run.sh: could not unmount $m" >&2
    done < <(mounts_under "$1")
}
cleanup() {
    local i
    for ((i = ${#MOUNTED[@]} - 1; i >= 0; i--)); do
        umount "${MOUNTED[i]}" 2>/dev/null || umount -l "${MOUNTED[i]}" 2>/dev/null || true
    done
    MOUNTED=()
    [[ -d $ROOTFS ]] && unmount_all_under "$ROOTFS"
    return 0
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
bind() {  # bind <host path> <path inside the rootfs> [ro]
    mkdir -p "$ROOTFS$2"
    mount --bind "$1" "$ROOTFS$2"
    MOUNTED+=("$ROOTFS$2")
    if [[ ${3:-} == ro ]]; then mount -o remount,bind,ro "$ROOTFS$2"; fi
}
mount_system() {  # what multiprocessing, shared_memory and /proc/<pid> checks need in the chroot
    mkdir -p "$ROOTFS/proc"
    mount -t proc proc "$ROOTFS/proc"
    MOUNTED+=("$ROOTFS/proc")
    bind /sys /sys
    bind /dev /dev
    if mountpoint -q /dev/shm; then bind /dev/shm /dev/shm; fi
    if mountpoint -q /dev/pts; then bind /dev/pts /dev/pts; fi
}
safe_rm_rootfs() {
    unmount_all_under "$ROOTFS"
    if [[ -n $(mounts_under "$ROOTFS") ]]; then
        echo "run.sh: something is still mounted under $ROOTFS: not deleting it" >&2
        exit 2
    fi
    rm -rf --one-file-system "$ROOTFS"
}

# ---------------------------------------------------------------------------- host packages
need_apt=()
command -v debootstrap >/dev/null 2>&1 || need_apt+=(debootstrap)
if ((EMULATED)); then
    command -v "qemu-$MACHINE-static" >/dev/null 2>&1 || need_apt+=(qemu-user-static)
    command -v update-binfmts >/dev/null 2>&1 || need_apt+=(binfmt-support)
fi
command -v git >/dev/null 2>&1 || need_apt+=(git)
[[ -f /usr/share/keyrings/debian-archive-keyring.gpg ]] || need_apt+=(debian-archive-keyring)
HOST_PY=
for py in python3 /usr/bin/python3; do
    if command -v "$py" >/dev/null 2>&1 && "$py" -m pip --version >/dev/null 2>&1; then HOST_PY=$py; break; fi
done
[[ -n $HOST_PY ]] || need_apt+=(python3-pip)
if ((${#need_apt[@]})); then
    log "installing ${need_apt[*]} with apt"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q --no-install-recommends "${need_apt[@]}"
    [[ -n $HOST_PY ]] || HOST_PY=/usr/bin/python3
fi

# ------------------------------------------------------------------------------ binfmt_misc
if ((EMULATED)); then
BINFMT=/proc/sys/fs/binfmt_misc
if ! mountpoint -q "$BINFMT"; then
    log "mounting binfmt_misc"
    mount binfmt_misc -t binfmt_misc "$BINFMT"
fi
if [[ ! -e $BINFMT/qemu-$MACHINE ]] || ! grep -qx enabled "$BINFMT/qemu-$MACHINE"; then
    log "registering qemu-$MACHINE with binfmt_misc"
    update-binfmts --enable qemu-$MACHINE || update-binfmts --import qemu-$MACHINE
fi
grep -qx enabled "$BINFMT/qemu-$MACHINE" || { echo "run.sh: qemu-$MACHINE is not enabled in $BINFMT" >&2; exit 2; }
fi

# --------------------------------------------------------------------------- root filesystem
mirror() {  # the Debian mirror apt already uses (one-line or deb822 sources), else deb.debian.org
    local m=
    if [[ -f /etc/apt/sources.list ]]; then
        m=$(awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i ~ /^(https?|file):/) { print $i; exit } }' \
            /etc/apt/sources.list | grep -v -e security -e updates | head -n1 || true)
    fi
    if [[ -z $m ]] && compgen -G "/etc/apt/sources.list.d/*.sources" >/dev/null; then
        m=$(awk 'tolower($1) == "uris:" { for (i = 2; i <= NF; i++) print $i }' /etc/apt/sources.list.d/*.sources \
            | grep -E '/debian/?$' | grep -v security | head -n1 || true)
    fi
    echo "${m:-http://deb.debian.org/debian}"
}
if [[ ! -f $BUILD/.stamp-rootfs ]]; then
    MIRROR=${ARM64_MIRROR:-$(mirror)}
    log "debootstrapping an $ARCH $SUITE root filesystem with $PY from $MIRROR (a few minutes)"
    [[ -e $ROOTFS ]] && safe_rm_rootfs
    mkdir -p "$BUILD"
    debootstrap --arch="$ARCH" --variant=minbase --include="$PYPKGS" "$SUITE" "$ROOTFS" "$MIRROR"
    echo "$SUITE $ARCH $MIRROR" >"$BUILD/.stamp-rootfs"
fi

# ----------------------------------------------------------------------------------- wheels
if [[ ! -f $WHEELS/.stamp ]] || [[ $(cat "$WHEELS/.stamp") != "$REQ_HASH" ]]; then
    log "downloading the $MACHINE Python $PYVER wheels of tests/chroot/requirements.txt"
    rm -rf "$WHEELS"
    mkdir -p "$WHEELS"
    PLATFORM_ARGS=()
    for p in "${WHEEL_PLATFORMS[@]}"; do PLATFORM_ARGS+=(--platform "$p"); done
    "$HOST_PY" -m pip download --quiet --dest "$WHEELS" --only-binary=:all: --implementation cp \
        --python-version "$PYVER" "${PLATFORM_ARGS[@]}" -r "$REQ"
    echo "$REQ_HASH" >"$WHEELS/.stamp"
fi

# ---------------------------------------------------------------- the venv inside the rootfs
unmount_all_under "$ROOTFS"   # left over by a run that was killed
mount_system
if [[ ! -f $ROOTFS$VENV/.stamp ]] || [[ $(cat "$ROOTFS$VENV/.stamp") != "$REQ_HASH" ]]; then
    log "installing the wheels into $VENV inside the root filesystem (longer under emulation)"
    rm -rf "$ROOTFS$VENV"
    bind "$WHEELS" /mnt/wheels ro
    cp "$REQ" "$ROOTFS/tmp/requirements.txt"
    chroot "$ROOTFS" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
        /bin/sh -c "$PY -m venv $VENV && $VENV/bin/python -m pip install --quiet --no-index \
            --disable-pip-version-check --find-links /mnt/wheels -r /tmp/requirements.txt"
    echo "$REQ_HASH" >"$ROOTFS$VENV/.stamp"
fi

# ----------------------------------------------------------------- the current working tree
log "copying the working tree into the chroot's /src"
rm -rf --one-file-system "$ROOTFS/src"
mkdir -p "$ROOTFS/src"
if git -C "$REPO" rev-parse --git-dir >/dev/null 2>&1; then
    # tracked and untracked files that git does not ignore; a tracked file deleted in the working
    # tree is skipped (--ignore-failed-read)
    git -C "$REPO" ls-files -z --cached --others --exclude-standard \
        | tar -C "$REPO" --null --ignore-failed-read -T - -cf - 2>/dev/null \
        | tar -C "$ROOTFS/src" -xf -
else
    tar -C "$REPO" --exclude=./.git --exclude=./.venv --exclude=./.chroots -cf - . | tar -C "$ROOTFS/src" -xf -
fi

# ------------------------------------------------------------------------------------ tests
if [[ $# -gt 0 && $1 == tests/* ]]; then
    TESTS=()               # the caller names what to run
else
    TESTS=()
    for t in "${CORE_TESTS[@]}"; do
        if [[ -f $REPO/$t ]]; then TESTS+=("$t"); else echo "run.sh: $t does not exist, not run" >&2; fi
    done
fi
DESELECT_ARGS=()
for d in "${DESELECT[@]}"; do DESELECT_ARGS+=(--deselect "$d"); done

mkdir -p "$ROOTFS/var/cache/numba"
# A fixed cwd, no bytecode written into /src, and Numba's on-disk cache (cache=True kernels) kept in
# the root filesystem between runs. Hypothesis keeps its example database in /src/.hypothesis.
CHROOT_ENV=(/usr/bin/env -i PATH="$VENV/bin:/usr/sbin:/usr/bin:/sbin:/bin" HOME=/root LANG=C.UTF-8
            PYTHONPATH=/src PYTHONDONTWRITEBYTECODE=1 NUMBA_CACHE_DIR=/var/cache/numba TERM="${TERM:-dumb}")
FOUND=$(chroot "$ROOTFS" "${CHROOT_ENV[@]}" python -c 'import platform, sys; print(platform.machine(), sys.version.split()[0])')
HOW=native
((EMULATED)) && HOW=emulated
log "$HOW Python: platform.machine() = ${FOUND% *}, Python ${FOUND#* } (host: $(uname -m))"
[[ ${FOUND% *} == "$MACHINE" ]] || { echo "run.sh: the chroot's Python is not $MACHINE" >&2; exit 2; }
[[ ${FOUND#* } == "$PYVER".* ]] || { echo "run.sh: the chroot's Python is not $PYVER" >&2; exit 2; }

SETUP=$((SECONDS - START))
if [[ ${1:-} == --python ]]; then
    shift
    bind "$REPO/benchmarks/results-2core" /results
    log "set-up took ${SETUP} s; running python $* ($HOW)"
    set +e
    chroot "$ROOTFS" "${CHROOT_ENV[@]}" /bin/sh -c 'cd /src && exec python "$@"' python "$@"
    STATUS=$?
    set -e
    log "python, $HOW Python ${FOUND#* } on ${FOUND% *}: exit status $STATUS, total wall time $((SECONDS - START)) s"
    exit "$STATUS"
fi
log "set-up took ${SETUP} s; running pytest ($HOW)"
T0=$SECONDS
set +e
chroot "$ROOTFS" "${CHROOT_ENV[@]}" /bin/sh -c 'cd /src && exec python -m pytest "$@"' pytest \
    -q -p no:cacheprovider "${TESTS[@]}" "${DESELECT_ARGS[@]}" "$@"
STATUS=$?
set -e
log "pytest, $HOW Python ${FOUND#* } on ${FOUND% *}: exit status $STATUS, tests $((SECONDS - T0)) s, set-up ${SETUP} s," \
    "total wall time $((SECONDS - START)) s"
exit "$STATUS"
