#!/bin/bash
# Part B (after run_a.sh on the same warm machine): Envoy, Prometheus and perf_analyzer
# unpacked, then the bench named by the arguments
# (`bash devices/site/run_b.sh placement --phase-s 25`), its JSON in $OUT with the bundle's
# commit and the machine in its meta.
U=$PWD/.devsite-unpacked
[ -f "$U/provenance.json" ] || { echo "part A is not unpacked on this machine"; exit 4; }
if [ ! -x "$U/bin/perf_analyzer" ]; then  # a later bench on the same machine carries nothing
  mkdir -p "$U"/envoy
  tar -xJf .devsite-b/envoy.tar.xz -C "$U"/envoy || exit 3
  tar -xJf .devsite-b/binaries.tar.xz -C "$U" || exit 3
  tar -xJf .devsite-b/models.tar.xz -C "$U"/models || exit 3
fi
source devices/site/env.sh
prometheus --version 2>&1 | head -1
name=$1; shift
R=$PWD; cd /tmp || exit 5  # not the repository's root: its ./sonicsite is not the package
timeout 520 python3 -m sonicsite bench "$name" --build-dir "$U/models" --json "$OUT/$name.json" "$@"
echo "bench rc=$?"
python3 "$R"/devices/site/stamp.py "$OUT/$name.json" "$U/provenance.json"
