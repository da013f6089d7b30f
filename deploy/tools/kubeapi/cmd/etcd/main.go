// Command etcd is the etcd server (go.etcd.io/etcd/server/v3, at the
// version k8s.io/kubernetes pins) for the API server make test-apiserver
// runs: the same flags as the etcd binary.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
