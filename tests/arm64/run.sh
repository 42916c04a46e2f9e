#!/usr/bin/env bash
# Runs shmvec's core test suite under an aarch64 (ARM64) Python 3.11 on an x86-64 Linux machine,
# through QEMU user-mode emulation (binfmt_misc) in a Debian bookworm arm64 chroot.
#
#   bash tests/arm64/run.sh                  # the core suite (make test-arm64)
#   bash tests/arm64/run.sh -k gae -x        # extra arguments go to pytest, after the core files
#   bash tests/arm64/run.sh tests/test_gae.py::test_kernels_are_cached_on_disk
#                                            # a first argument under tests/ replaces the core files
#
# Everything installs itself on a fresh Debian/Ubuntu machine (needs root, or sudo) and is built once
# under .arm64/ at the repository root (git-ignored): the apt packages (qemu-user-static, debootstrap,
# binfmt-support), the arm64 root filesystem, the aarch64 wheels of tests/arm64/requirements.txt and
# a venv inside the root filesystem. A second run reuses all of it; editing requirements.txt
# re-downloads the wheels and rebuilds the venv. `rm -rf .arm64` starts over.
#
# Each run copies the current working tree (tracked and untracked, not ignored, files) into the
# chroot's /src, so the tests never write into the checkout, and exits with pytest's status.
#
# Environment: ARM64_BUILD_DIR (default <repo>/.arm64), ARM64_MIRROR (default: the Debian mirror
# apt is configured with), ARM64_SUITE (default bookworm: its python3 is 3.11).
set -euo pipefail

if [[ ${EUID:-$(id -u)} -ne 0 ]]; then
    if command -v sudo >/dev/null 2>&1; then
        exec sudo -E bash "${BASH_SOURCE[0]}" "$@"
    fi
    echo "run.sh: needs root (chroot, mount, binfmt_misc) and sudo is not installed" >&2
    exit 2
fi

START=$SECONDS
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
BUILD=${ARM64_BUILD_DIR:-$REPO/.arm64}
ROOTFS=$BUILD/rootfs
WHEELS=$BUILD/wheels
REQ=$HERE/requirements.txt
SUITE=${ARM64_SUITE:-bookworm}
VENV=/opt/venv               # inside the root filesystem
REQ_HASH=$(sha256sum "$REQ" | cut -d' ' -f1)

# The core suite. test_async, test_faults, ... start worker processes and talk to them through
# shared memory (/dev/shm) and futex-style waits; test_gae compiles the Numba kernels for aarch64.
CORE_TESTS=(
    tests/test_equivalence.py tests/test_faults.py tests/test_async.py tests/test_rollout.py
    tests/test_gae.py tests/test_snapshots.py tests/test_sync.py tests/test_layout.py
    tests/test_segment.py tests/test_barrier.py
)

# Deselected (every other test of the files runs):
# - the "sb3" cases of test_faults import shmvec.sb3, i.e. stable_baselines3 and so torch: torch
#   is a ~100 MB+ wheel whose import alone takes minutes under emulation, and the SB3 adapter has no
#   aarch64-specific code (the "make" and "baselines" cases of the same tests drive the same
#   ShmVecEnv). Without torch they would only be skipped by pytest.importorskip.
# - the "memory" fault of test_faults' death suite (3 start methods x raise/restart): an emulation
#   limit, not a shmvec bug, and unsafe to run here. FaultyEnv("memory") caps its worker's address
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
    "tests/test_faults.py::test_every_death_raises_a_clear_error_and_closes[memory-fork]"
    "tests/test_faults.py::test_every_death_raises_a_clear_error_and_closes[memory-forkserver]"
    "tests/test_faults.py::test_every_death_raises_a_clear_error_and_closes[memory-spawn]"
    "tests/test_faults.py::test_every_death_restarts_its_worker[memory-fork]"
    "tests/test_faults.py::test_every_death_restarts_its_worker[memory-forkserver]"
    "tests/test_faults.py::test_every_death_restarts_its_worker[memory-spawn]"
)

log() { printf '\n== arm64: %s\n' "$*"; }

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
command -v qemu-aarch64-static >/dev/null 2>&1 || need_apt+=(qemu-user-static)
command -v debootstrap >/dev/null 2>&1 || need_apt+=(debootstrap)
command -v update-binfmts >/dev/null 2>&1 || need_apt+=(binfmt-support)
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
BINFMT=/proc/sys/fs/binfmt_misc
if ! mountpoint -q "$BINFMT"; then
    log "mounting binfmt_misc"
    mount binfmt_misc -t binfmt_misc "$BINFMT"
fi
if [[ ! -e $BINFMT/qemu-aarch64 ]] || ! grep -qx enabled "$BINFMT/qemu-aarch64"; then
    log "registering qemu-aarch64 with binfmt_misc"
    update-binfmts --enable qemu-aarch64 || update-binfmts --import qemu-aarch64
fi
grep -qx enabled "$BINFMT/qemu-aarch64" || { echo "run.sh: qemu-aarch64 is not enabled in $BINFMT" >&2; exit 2; }

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
    log "debootstrapping an arm64 $SUITE root filesystem from $MIRROR (a few minutes)"
    [[ -e $ROOTFS ]] && safe_rm_rootfs
    mkdir -p "$BUILD"
    debootstrap --arch=arm64 --variant=minbase --include=python3,python3-venv "$SUITE" "$ROOTFS" "$MIRROR"
    echo "$SUITE arm64 $MIRROR" >"$BUILD/.stamp-rootfs"
fi

# ----------------------------------------------------------------------------------- wheels
if [[ ! -f $WHEELS/.stamp ]] || [[ $(cat "$WHEELS/.stamp") != "$REQ_HASH" ]]; then
    log "downloading the aarch64 wheels of tests/arm64/requirements.txt"
    rm -rf "$WHEELS"
    mkdir -p "$WHEELS"
    "$HOST_PY" -m pip download --quiet --dest "$WHEELS" --only-binary=:all: --implementation cp \
        --python-version 3.11 --platform manylinux_2_28_aarch64 --platform manylinux2014_aarch64 \
        --platform linux_aarch64 -r "$REQ"
    echo "$REQ_HASH" >"$WHEELS/.stamp"
fi

# ---------------------------------------------------------------- the venv inside the rootfs
unmount_all_under "$ROOTFS"   # left over by a run that was killed
mount_system
if [[ ! -f $ROOTFS$VENV/.stamp ]] || [[ $(cat "$ROOTFS$VENV/.stamp") != "$REQ_HASH" ]]; then
    log "installing the wheels into $VENV inside the root filesystem (emulated: a few minutes)"
    rm -rf "$ROOTFS$VENV"
    bind "$WHEELS" /mnt/wheels ro
    cp "$REQ" "$ROOTFS/tmp/requirements.txt"
    chroot "$ROOTFS" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
        /bin/sh -c "python3 -m venv $VENV && $VENV/bin/python -m pip install --quiet --no-index \
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
    tar -C "$REPO" --exclude=./.git --exclude=./.venv --exclude=./.arm64 -cf - . | tar -C "$ROOTFS/src" -xf -
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
ARCH=$(chroot "$ROOTFS" "${CHROOT_ENV[@]}" python -c 'import platform, sys; print(platform.machine(), sys.version.split()[0])')
log "emulated Python: platform.machine() = ${ARCH% *}, Python ${ARCH#* } (host: $(uname -m))"
[[ ${ARCH% *} == aarch64 ]] || { echo "run.sh: the chroot's Python is not aarch64" >&2; exit 2; }

SETUP=$((SECONDS - START))
log "set-up took ${SETUP} s; running pytest under emulation"
T0=$SECONDS
set +e
chroot "$ROOTFS" "${CHROOT_ENV[@]}" /bin/sh -c 'cd /src && exec python -m pytest "$@"' pytest \
    -q -p no:cacheprovider "${TESTS[@]}" "${DESELECT_ARGS[@]}" "$@"
STATUS=$?
set -e
log "pytest under aarch64 emulation: exit status $STATUS, tests $((SECONDS - T0)) s, set-up ${SETUP} s," \
    "total wall time $((SECONDS - START)) s"
exit "$STATUS"
