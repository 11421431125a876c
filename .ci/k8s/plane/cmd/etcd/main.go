// Command etcd is upstream etcd's server main (go.etcd.io/etcd/server/v3/etcdmain), built at the
// version k8s.io/kubernetes pins, so the control plane's store is the real one in its own process.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
