#!/bin/bash
# The CUDA shared-memory device check: the carried Triton, wheels and models, then cuda_check.py.
nvidia-smi -L
PY=python3; $PY -V; command -v $PY
T=/tmp/dev; mkdir -p $T/site $T/pkg $T/tri
tar -xJf .dev/triton.tar.xz -C $T/tri
tar -xJf .dev/tritonclient.tar.xz -C $T/site
$PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target $T/site .dev/whl/*.whl || exit 3
cp -r sonicsite $T/pkg/; for d in client operator gateway models bench sim; do cp -r $d $T/pkg/sonicsite/$d; done
LIBPY=$(find / -xdev -name 'libpython3.12.so.1.0' 2>/dev/null | head -1); echo "libpython: $LIBPY"
[ -z "$LIBPY" ] && find / -xdev -name 'libpython3*.so*' 2>/dev/null | head
export LD_LIBRARY_PATH=$(dirname "${LIBPY:-/nonexistent/x}"):${LD_LIBRARY_PATH:-}
export PYTHONPATH=$T/pkg:$T/tri:$T/site
export DEV_STUB_PATH=$T/pkg:$T/site
export SONICSITE_CUDART=$(ls $T/tri/nvidia_pytriton.libs/libcudart-*.so.12* | head -1)
PYTHONUNBUFFERED=1 timeout 360 $PY .dev/check.py
echo "cuda_check rc=$?"
