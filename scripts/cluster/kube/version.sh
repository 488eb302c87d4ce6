#!/usr/bin/env bash
# The Kubernetes version the project builds and runs: the one go.mod in this directory pins.
awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v/ {print $2; exit}' "$(dirname "$0")/go.mod"
