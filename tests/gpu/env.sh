# tests/gpu/env.sh: what every device script here sources first (`. tests/gpu/env.sh`, from the repository
# root): the device machine's rules (never NVLink multicast) and unbuffered Python, $OUT (/tmp/krex-out unless
# set; made), the carried wheels of .whl/ (cffi, pycparser) installed into /tmp/site when there are any, and
# PYTHONPATH with this tree and /tmp/site.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/krex-out}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
export PYTHONPATH=$PWD:/tmp/site
