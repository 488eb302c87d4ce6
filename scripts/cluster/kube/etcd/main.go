// etcd for the project's real cluster: the server at the version go.mod pins (Debian's etcd
// 3.4 is older than a current kube-apiserver supports).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
