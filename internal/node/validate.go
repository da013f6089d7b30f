package node

import (
	"fmt"
	"math"
	"unicode"
	"unicode/utf8"

	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// checkText refuses a string that is not valid UTF-8 or holds a control
// character or a rune that does not print (the directory shows worker ids,
// models and addresses to operators and logs, and routers dial addresses).
func checkText(what, s string) error {
	if !utf8.ValidString(s) {
		return fmt.Errorf("%s %q is not valid UTF-8", what, s)
	}
	for i, r := range s {
		if !unicode.IsPrint(r) {
			return fmt.Errorf("%s %q holds a control or non-printable character (%U at byte %d)", what, s, r, i)
		}
	}
	return nil
}

// checkSpecText checks the text fields of a registration's spec.
func checkSpecText(spec *kvdirv1.WorkerSpec) error {
	for _, f := range []struct{ what, v string }{
		{"worker id", spec.Id}, {"model", spec.Model}, {"address", spec.Address},
	} {
		if err := checkText(f.what, f.v); err != nil {
			return err
		}
	}
	for k, v := range spec.Labels {
		if err := checkText("label key", k); err != nil {
			return err
		}
		if err := checkText("label "+k, v); err != nil {
			return err
		}
	}
	return nil
}

// sanitizeLoad clamps a heartbeat's KV-cache usage: NaN and negative
// values become 0, +Inf becomes 1 (routers compare usages, and a NaN
// compares false with everything). It reports whether it changed anything.
func sanitizeLoad(l *kvdirv1.Load) bool {
	if l == nil {
		return false
	}
	switch u := l.KvUsage; {
	case math.IsNaN(u) || u < 0:
		l.KvUsage = 0
	case math.IsInf(u, 1):
		l.KvUsage = 1
	default:
		return false
	}
	return true
}
