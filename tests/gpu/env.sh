# tests/gpu/env.sh: what every device script here sources first (`. tests/gpu/env.sh`, from the repository
# root): the device machine's rules (never NVLink multicast) and unbuffered Python, $OUT (/tmp/krex-out unless
# set; made), the carried wheels of .whl/ (cffi, pycparser) installed into /tmp/site when there are any, and
# PYTHONPATH with this tree and /tmp/site; cpu_topology prints the CPUs, which of them share a core (SMT
# siblings) and krex's default reserved cores (the last eighth), for a run's log.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/krex-out}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
export PYTHONPATH=$PWD:/tmp/site
cpu_topology() {
  echo "cpus: $(nproc) usable; model: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
  echo "smt siblings: $(cat /sys/devices/system/cpu/cpu[0-9]*/topology/thread_siblings_list 2>/dev/null | sort -u | tr '\n' ' ')"
  echo "numa nodes: $(ls -d /sys/devices/system/node/node[0-9]* 2>/dev/null | wc -l); krex reserved (default): $(python3 -c 'import os; from krex_ctl.config import default_reserved; print(default_reserved(os.sched_getaffinity(0)))' 2>/dev/null)"
}
