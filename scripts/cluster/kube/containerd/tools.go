//go:build tools

// containerd 2 for the real cluster's nodes (a kubelet of 1.36+ refuses containerd 1.x, and
// Debian 12 ships 1.6). Its own module: its dependencies need not agree with Kubernetes'.
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
