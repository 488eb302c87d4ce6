//go:build tools

// The program build.sh builds, listed so that `go mod tidy` keeps every module it needs in
// go.mod and go.sum (the build tag keeps this file out of every real build).
package tools

import (
	_ "sigs.k8s.io/kube-network-policies/cmd"
)
