#!/usr/bin/env bash
# Renders the pictures under docs/img/ from their Graphviz sources in docs/src/.
# Needs Debian's graphviz (dot); run from anywhere: bash scripts/docs-images.sh
# Check a picture's legibility as a PNG: rsvg-convert docs/img/NAME.svg -o /tmp/NAME.png (librsvg2-bin).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v dot >/dev/null || { echo "install graphviz (apt-get install graphviz)" >&2; exit 1; }
mkdir -p docs/img
for src in docs/src/*.dot; do
  out="docs/img/$(basename "${src%.dot}").svg"
  dot -Tsvg "$src" -o "$out"
  echo "$out"
done
