// etcd's own main (go.etcd.io/etcd/server/v3/etcdmain), built from the Go module proxy.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
