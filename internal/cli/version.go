package cli

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// version and commit are set at build time:
//
//	go build -ldflags "-X github.com/kvdir/kvdir/internal/cli.version=v1.2.3 -X github.com/kvdir/kvdir/internal/cli.commit=0123abc"
//
// Left empty, they come from the build information the Go tool records
// (the module version, and the VCS revision when built in a checkout).
var version, commit string

// Version returns the version of the binaries: the -ldflags value, else the
// main module's version, else "dev".
func Version() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
}

// Commit returns the VCS revision the binaries were built from, shortened
// to 12 characters and marked "-dirty" for a modified tree, or "unknown".
func Commit() string {
	if commit != "" {
		return commit
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	rev, dirty := "", false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if rev == "" {
		return "unknown"
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if dirty {
		rev += "-dirty"
	}
	return rev
}

// VersionLine is what --version prints: "kvdir <name> <version> (commit
// <commit>, <go version> <os>/<arch>)".
func VersionLine(name string) string {
	return fmt.Sprintf("kvdir %s %s (commit %s, %s %s/%s)", name, Version(), Commit(), runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
