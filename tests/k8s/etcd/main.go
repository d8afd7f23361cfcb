// Command etcd is etcd's server for the real-cluster tests, built from
// go.etcd.io/etcd/server/v3 at the version go.mod pins: etcd's own main module
// replaces its sibling modules with local paths, so `go install` cannot build it
// by name, and this module calls the same entry point its main does.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
