#!/bin/bash
# Part A of a site bench on a lent GPU machine (README.md beside this): Triton, tritonclient,
# the wheels and the models into .devsite-unpacked/, our packages linked as `sonicsite`;
# then every part of the site imports, and one server serves part A's models (smoke.py).
U=$PWD/.devsite-unpacked; rm -rf "$U"; mkdir -p "$U"/site "$U"/tri "$U"/pkg/sonicsite "$U"/models
nproc; python3 -V
tar -xJf .devsite-a/triton.tar.xz -C "$U"/tri || exit 3
tar -xJf .devsite-a/tritonclient.tar.xz -C "$U"/site || exit 3
tar -xJf .devsite-a/models.tar.xz -C "$U"/models || exit 3
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$U"/site \
  .devsite-a/whl/*.whl || exit 3
cp .devsite-a/provenance.json "$U"/
for f in sonicsite/*; do ln -s "$PWD/$f" "$U/pkg/sonicsite/"; done
for d in client operator gateway models bench sim; do ln -s "$PWD/$d" "$U/pkg/sonicsite/$d"; done
source devices/site/env.sh
R=$PWD; cd /tmp || exit 5  # not the repository's root: its ./sonicsite is not the package
timeout 200 python3 "$R"/devices/site/smoke.py "$U/models" || exit 5
echo "part A ready"
