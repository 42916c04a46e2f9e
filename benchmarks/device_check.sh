#!/usr/bin/env bash
# One prepared run on a lent GPU machine (16 cores, one GPU, no network): the GPU tests,
# bench-gpu's measurement and the scaling tables, each under its own time limit so that one
# failure does not cost the rest. Packages its image lacks (gymnasium, ale-py, mujoco) travel
# as wheels in .whl/. Results and logs go to $OUT (default results/device). STEPS picks the parts
# (default: "tests gpu scaling_cartpole scaling_real"); REAL_ENVS and REAL_WORKERS size the real-env table
# (64 envs: the size #28's targets name, sync and async, with the workers' thread pools capped).
# 15 workers beside 16: whether leaving the calling process a core beats a worker per core there
# (15 does not divide the sizes, so that row has no async cell).
set -u
OUT=${OUT:-results/device}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=$PWD:/tmp/site
fi
{ nproc; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
  python3 -c "import torch, numpy, numba, gymnasium; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'numpy', numpy.__version__, 'gymnasium', gymnasium.__version__)"
} 2>&1 | tee "$OUT/machine.txt"
step() {  # name, seconds, command...
    local name=$1 limit=$2; shift 2
    echo "== $name"
    timeout "$limit" "$@" > >(tee "$OUT/$name.txt") 2>&1
    echo "== $name: exit $?"
}
want() { [[ " ${STEPS:-tests gpu scaling_cartpole scaling_real} " == *" $1 "* ]]; }
want tests && step tests 110 python3 -m pytest -q -p no:cacheprovider -x tests/test_torch.py tests/test_docstrings.py
want gpu && step gpu 140 python3 benchmarks/gpu.py --workloads ${GPU_WORKLOADS:-atari-like,atari-pong} --num-envs ${GPU_ENVS:-128} --steps 100 --rounds 5 \
    --json "$OUT/gpu.json"
want scaling_cartpole && step scaling_cartpole 130 python3 benchmarks/scaling.py --workloads cartpole --num-envs 256 --workers 1,4,8,15,16 \
    --seconds 0.5 --repeats 3 --json "$OUT/scaling_cartpole.json"
want scaling_real && step scaling_real 230 python3 benchmarks/scaling.py --workloads atari-pong,mujoco-ant \
    --num-envs ${REAL_ENVS:-64} --engines split-serial,shmvec,shmvec-async,gym-async-shm --workers ${REAL_WORKERS:-15,16} \
    --max-procs 70 \
    --seconds 0.5 --repeats 3 --json "$OUT/scaling_real.json"
