# Sourced by run_a.sh and run_b.sh: the unpacked site's packages first on the import path,
# the system libpython for the Python-backend stub, Prometheus on PATH.
U=$PWD/.devsite-unpacked
export PYTHONPATH=$U/pkg:$U/tri:$U/site:$U/envoy
LIBPY=$(find / -xdev -name 'libpython3.12.so.1.0' 2>/dev/null | head -1)
echo "libpython for the stub: ${LIBPY:-none found}"
export LD_LIBRARY_PATH=$(dirname "${LIBPY:-/nonexistent/x}"):${LD_LIBRARY_PATH:-}
export PATH=$U/bin:$PATH
export PYTHONUNBUFFERED=1
