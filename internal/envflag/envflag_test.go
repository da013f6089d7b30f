package envflag

import (
	"flag"
	"io"
	"testing"
)

func TestApply(t *testing.T) {
	env := map[string]string{"P_KV_BLOCKS": "7", "P_NAME": "from-env", "P_EMPTY": ""}
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	blocks := fs.Int("kv-blocks", 1, "")
	name := fs.String("name", "default", "")
	empty := fs.String("empty", "default", "")
	if err := fs.Parse([]string{"--name", "from-flag"}); err != nil {
		t.Fatal(err)
	}
	if err := Apply(fs, "P_", func(k string) string { return env[k] }); err != nil {
		t.Fatal(err)
	}
	if *blocks != 7 || *name != "from-flag" || *empty != "default" {
		t.Fatalf("kv-blocks %d, name %q, empty %q", *blocks, *name, *empty)
	}
	env["P_KV_BLOCKS"] = "seven"
	fs2 := flag.NewFlagSet("t", flag.ContinueOnError)
	fs2.Int("kv-blocks", 1, "")
	if err := Apply(fs2, "P_", func(k string) string { return env[k] }); err == nil {
		t.Fatal("a bad value in the environment was accepted")
	}
}
