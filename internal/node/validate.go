package node

import (
	"fmt"
	"math"
	"unicode"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvdir/kvdir/internal/raftfsm"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// checkText refuses a string that is not valid UTF-8 or holds a control
// character or a rune that does not print (the directory shows worker ids,
// models and addresses to operators and logs, and routers dial addresses).
// The error quotes at most the first quotedPrefix bytes of s.
func checkText(what, s string) error {
	if !utf8.ValidString(s) {
		return fmt.Errorf("%s %s is not valid UTF-8", what, quotePrefix(s))
	}
	for i, r := range s {
		if !unicode.IsPrint(r) {
			return fmt.Errorf("%s %s holds a control or non-printable character (%U at byte %d)", what, quotePrefix(s), r, i)
		}
	}
	return nil
}

// quotedPrefix bounds how much of a refused string an error quotes.
const quotedPrefix = 64

// quotePrefix quotes s or, past quotedPrefix bytes, its first ones (cut
// on a rune boundary) followed by its length.
func quotePrefix(s string) string {
	if len(s) <= quotedPrefix {
		return fmt.Sprintf("%q", s)
	}
	n := quotedPrefix
	for n > quotedPrefix-utf8.UTFMax && !utf8.RuneStart(s[n]) {
		n--
	}
	return fmt.Sprintf("%q... (%d bytes)", s[:n], len(s))
}

// checkSpec refuses, with InvalidArgument and before anything is
// proposed, a spec whose text does not print (checkSpecText) or that the
// state machine would refuse whatever its state (raftfsm.CheckWorkerSpec:
// sizes and ranges), and counts the refusal. The text goes first: the
// state machine's errors quote the worker id whole.
func (n *Node) checkSpec(spec *kvdirv1.WorkerSpec) error {
	if spec == nil || spec.Id == "" {
		return status.Error(codes.InvalidArgument, "register: worker.id is required")
	}
	if err := checkSpecText(spec); err != nil {
		n.metrics.refusedIDs.Inc()
		return status.Errorf(codes.InvalidArgument, "register: %v", err)
	}
	if err := raftfsm.CheckWorkerSpec(spec); err != nil {
		n.metrics.refusedIDs.Inc()
		return status.Error(codes.InvalidArgument, err.Error())
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
		if err := checkText("label "+quotePrefix(k), v); err != nil {
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
