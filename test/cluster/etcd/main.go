// Command etcd is upstream etcd's server, unchanged: its module root carries replace directives,
// so `go install go.etcd.io/etcd/v3` is refused and this one-line wrapper is the way to build it.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
