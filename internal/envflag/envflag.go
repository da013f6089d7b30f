// Package envflag gives every flag of a flag set an environment variable:
// --kv-blocks is PREFIX_KV_BLOCKS. The command line wins over the
// environment.
package envflag

import (
	"flag"
	"fmt"
	"strings"
)

// Name returns the environment variable of a flag.
func Name(prefix, flagName string) string {
	return prefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// Apply sets, from getenv, every flag of fs that the parsed command line
// did not set. Call it after fs.Parse. Empty variables count as unset.
func Apply(fs *flag.FlagSet, prefix string, getenv func(string) string) error {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if set[f.Name] || err != nil {
			return
		}
		env := Name(prefix, f.Name)
		if v := getenv(env); v != "" {
			if e := fs.Set(f.Name, v); e != nil {
				err = fmt.Errorf("environment %s: %w", env, e)
			}
		}
	})
	return err
}
