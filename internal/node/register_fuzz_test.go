package node

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/kvdir/kvdir/internal/raftfsm"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

var fuzzTokens = Tokens{Router: "router-secret-0123456789", Admin: "admin-secret-0123456789"}

// fuzzCreds are FuzzRegister's agent credentials, each with the rule its
// patterns stand for written out without path.Match ('*' and '?' do not
// match '/').
var fuzzCreds = []struct {
	cred   Credential
	allows func(id string) bool
}{
	{Credential{Name: "alice", Token: "alice-secret-0123456789", Patterns: []string{"a-*"}},
		func(id string) bool { return strings.HasPrefix(id, "a-") && !strings.Contains(id, "/") }},
	{Credential{Name: "bob", Token: "bob-secret-0123456789", Patterns: []string{"b-*", "shared-*"}},
		func(id string) bool {
			return (strings.HasPrefix(id, "b-") || strings.HasPrefix(id, "shared-")) && !strings.Contains(id, "/")
		}},
	{Credential{Name: "carol", Token: "carol-secret-0123456789", Patterns: []string{"shared-*"}},
		func(id string) bool { return strings.HasPrefix(id, "shared-") && !strings.Contains(id, "/") }},
	{Credential{Name: "dave", Token: "dave-secret-0123456789", Patterns: []string{"pod-?/dp[0-3]"}},
		regexp.MustCompile(`^pod-[^/]/dp[0-3]$`).MatchString},
}

// fuzzServed are the models of a group that serves only some.
var fuzzServed = []string{"m", "Llama 3 8B"}

// fuzzCaller is who a FuzzRegister call comes from.
type fuzzCaller struct {
	admin, router bool
	cred          int // index in fuzzCreds, or -1
}

// callAs returns the incoming context of a call with bearer token tok, and
// who that token makes the caller, by comparing it with every configured
// token.
func callAs(tok string) (context.Context, fuzzCaller) {
	c := fuzzCaller{admin: tok == fuzzTokens.Admin, router: tok == fuzzTokens.Router, cred: -1}
	for i, fc := range fuzzCreds {
		if tok == fc.cred.Token {
			c.cred = i
		}
	}
	ctx := context.Background()
	if tok != "" {
		ctx = metadata.NewIncomingContext(ctx, metadata.Pairs("authorization", "Bearer "+tok))
	}
	return ctx, c
}

// bearerOf picks FuzzRegister's token: none, the router's, the admin's, a
// credential's, or raw.
func bearerOf(who uint8, raw string) string {
	switch k := int(who) % (4 + len(fuzzCreds)); {
	case k == 0:
		return ""
	case k == 1:
		return fuzzTokens.Router
	case k == 2:
		return fuzzTokens.Admin
	case k == 3:
		return raw
	default:
		return fuzzCreds[k-4].cred.Token
	}
}

// newRegisterNode is a node with what a registration reaches short of
// Raft: the authorizer, configuration, metrics and a state machine.
func newRegisterNode(t testing.TB) *Node {
	creds := make([]Credential, len(fuzzCreds))
	for i, fc := range fuzzCreds {
		creds[i] = fc.cred
	}
	auth, err := newAuthorizer(fuzzTokens, creds, 0, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	return &Node{
		cfg:     Config{MaxWorkersPerCredential: 4, WorkerBlockQuota: 1 << 10},
		log:     slog.New(slog.DiscardHandler),
		metrics: newMetrics(prometheus.NewRegistry()),
		auth:    auth,
		fsm:     raftfsm.New(raftfsm.Options{Logger: slog.New(slog.DiscardHandler)}),
	}
}

// registerNoRaft runs a Register call through every step the leader takes
// (agentService.Register and the authorizer's interceptor), with the
// command applied to the state machine at index instead of proposed.
func (n *Node) registerNoRaft(ctx context.Context, req *kvdirv1.RegisterRequest, index uint64) (*kvdirv1.RegisterCommand, string, uint64, error) {
	if err := n.auth.check(ctx, kvdirv1.AgentService_Register_FullMethodName); err != nil {
		return nil, "", 0, err
	}
	if err := n.checkSpec(req.Worker); err != nil {
		return nil, "", 0, err
	}
	if err := n.checkServedModel(req.Worker); err != nil {
		return nil, "", 0, err
	}
	cmd := &kvdirv1.RegisterCommand{Worker: req.Worker}
	token, err := n.stampRegister(ctx, cmd)
	if err != nil {
		return nil, "", 0, err
	}
	data, err := raftfsm.Encode(kvdirv1.CommandType_COMMAND_TYPE_REGISTER, cmd, 1)
	if err != nil {
		return nil, "", 0, err
	}
	switch res := n.fsm.Apply(&raft.Log{Index: index, Term: 1, Type: raft.LogCommand, Data: data}).(type) {
	case error:
		if status.Code(refusalStatus(res)) == codes.InvalidArgument {
			return nil, "", 0, fmt.Errorf("the state machine refused what Register let through: %w", res)
		}
		return nil, "", 0, refusalStatus(res)
	case *raftfsm.RegisterResult:
		return cmd, token, res.Epoch, nil
	default:
		return nil, "", 0, fmt.Errorf("register result %T", res)
	}
}

func printable(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return false
		}
	}
	return true
}

// badFields names (as their refusals do) the fields of spec that Register
// must refuse with InvalidArgument: text that does not print or is over
// the state machine's limits, a block size or rank out of range.
func badFields(spec *kvdirv1.WorkerSpec) []string {
	var bad []string
	if spec.Id == "" || !printable(spec.Id) || len(spec.Id) > 256 {
		bad = append(bad, "worker")
	}
	if !printable(spec.Model) || len(spec.Model) > 1024 {
		bad = append(bad, "model")
	}
	if !printable(spec.Address) || len(spec.Address) > 2048 {
		bad = append(bad, "address")
	}
	labels := len(spec.Labels) > 64
	for k, v := range spec.Labels {
		labels = labels || !printable(k) || !printable(v) || len(k) > 256 || len(v) > 256
	}
	if labels {
		bad = append(bad, "label")
	}
	if spec.BlockSize > 1<<16 {
		bad = append(bad, "block size")
	}
	if spec.DataParallelRank != nil && *spec.DataParallelRank > 255 {
		bad = append(bad, "data-parallel rank")
	}
	return bad
}

// wantRegister is the code Register answers c with for spec, in the order
// it checks: the caller's role, the spec, the served models, then whether
// the caller's credential may register the id.
func wantRegister(c fuzzCaller, spec *kvdirv1.WorkerSpec, onlyServed bool) codes.Code {
	switch {
	case !c.admin && !c.router && c.cred < 0:
		return codes.Unauthenticated
	case !c.admin && c.cred < 0:
		return codes.PermissionDenied // the router's token
	case len(badFields(spec)) > 0:
		return codes.InvalidArgument
	case onlyServed && !slices.Contains(fuzzServed, spec.Model):
		return codes.FailedPrecondition
	case !c.admin && !fuzzCreds[c.cred].allows(spec.Id):
		return codes.PermissionDenied
	}
	return codes.OK
}

// checkRefusal checks that a refusal's message is short and prints
// whole (it reaches agents' logs), and that an InvalidArgument one names
// a field that is wrong.
func checkRefusal(t *testing.T, err error, spec *kvdirv1.WorkerSpec) {
	t.Helper()
	msg := status.Convert(err).Message()
	limit := 4096
	if status.Code(err) == codes.InvalidArgument {
		limit = 1024
		bad := badFields(spec)
		if !slices.ContainsFunc(bad, func(f string) bool { return strings.Contains(msg, f) }) {
			t.Errorf("refusal %q names none of the bad fields %q", msg, bad)
		}
	}
	if len(msg) > limit {
		t.Errorf("a %d-byte refusal (limit %d): %.200q...", len(msg), limit, msg)
	}
	if !printable(msg) {
		t.Errorf("refusal %q does not print", msg)
	}
}

// FuzzRegister registers a fuzzed worker spec (id, address, model, block
// size, data-parallel rank, labels) with a fuzzed bearer token through
// every step the leader takes short of Raft, and checks that: nothing
// panics; the answer's code is the one the rules give (a role that may not
// register, text that does not print or is too long, sizes out of range,
// an unserved model, an id outside the credential's patterns); refusals
// are short, print and name the field; nothing the node lets through is
// refused as invalid by the state machine; an accepted spec prints, is
// stored as sent, owned by its credential with the returned token; and a
// second registration of the same id by another credential is refused
// whether or not its patterns cover the id.
func FuzzRegister(f *testing.F) {
	long := strings.Repeat("x", 300)
	for _, s := range []struct {
		id, addr, model      string
		block                uint32
		rank                 int64
		labelKey, labelValue string
		moreLabels           uint8
		who, who2            uint8
		raw                  string
		onlyServed           bool
	}{
		{"a-1", "http://10.0.0.7:8000", "m", 16, -1, "zone", "eu-1", 0, 4, 5, "", false},
		{"shared-1", "http://10.0.0.8:8000", "m", 16, -1, "", "", 0, 5, 6, "", false},
		{"shared-2", "", "", 0, -1, "", "", 0, 2, 6, "", false},
		{"pod-7/dp0", "http://10.0.0.7:8000", "Llama 3 8B", 16, 0, "gpu", "H100", 0, 7, 4, "", true},
		{"pod-7/dp9", "", "m", 16, 1, "", "", 0, 7, 0, "", false},
		{"b-1", "", "m", 16, -1, "", "", 0, 4, 1, "", false},
		{"a-1/x", "", "m", 16, -1, "", "", 0, 4, 1, "", false},
		{"a-\x1b[31mred", "", "m", 16, -1, "", "", 0, 4, 1, "", false},
		{"a-1", "http://h\r\nX-Evil: 1", "m", 16, -1, "", "", 0, 4, 1, "", false},
		{"a-\xff", "", "m\x00", 16, -1, "", "", 0, 4, 1, "", false},
		{"a-\u200b", "", "m", 16, -1, "", "", 0, 4, 1, "", false},
		{"a-\u202e1", "", "m", 16, -1, "", "", 0, 2, 1, "", false},
		{"a-" + long, "", "m", 16, -1, "", "", 0, 4, 1, "", false},
		{"a-1", strings.Repeat(long, 7), "m", 16, -1, "", "", 0, 4, 1, "", false},
		{"a-1", "", strings.Repeat(long, 4), 16, -1, "", "", 0, 4, 1, "", false},
		{"a-1", "", "m", 16, -1, long, "v", 0, 4, 1, "", false},
		{"a-1", "", "m", 16, -1, "k", long + "\t", 0, 4, 1, "", false},
		{"a-1", "", "m", 16, -1, "", "", 65, 4, 1, "", false},
		{"a-1", "", "m", 1<<16 + 1, -1, "", "", 0, 4, 1, "", false},
		{"a-1", "", "m", 16, 256, "", "", 0, 4, 1, "", false},
		{"a-1", "", "other", 16, -1, "", "", 0, 4, 1, "", true},
		{"a-1", "", "m", 16, -1, "", "", 0, 0, 1, "", false},
		{"a-1", "", "m", 16, -1, "", "", 0, 1, 1, "", false},
		{"a-1", "", "m", 16, -1, "", "", 0, 3, 1, "guess", false},
		{"", "", "m", 16, -1, "", "", 0, 4, 1, "", false},
	} {
		f.Add(s.id, s.addr, s.model, s.block, s.rank, s.labelKey, s.labelValue, s.moreLabels, s.who, s.who2, s.raw, s.onlyServed)
	}
	n := newRegisterNode(f)
	f.Fuzz(func(t *testing.T, id, addr, model string, block uint32, rank int64, labelKey, labelValue string,
		moreLabels, who, who2 uint8, raw string, onlyServed bool) {
		spec := &kvdirv1.WorkerSpec{Id: id, Address: addr, Model: model, BlockSize: block}
		if rank >= 0 {
			r := uint32(min(rank, 1<<32-1))
			spec.DataParallelRank = &r
		}
		if labelKey != "" || labelValue != "" || moreLabels > 0 {
			spec.Labels = map[string]string{labelKey: labelValue}
			for i := range int(moreLabels) {
				spec.Labels[fmt.Sprintf("k%d", i)] = "v"
			}
		}
		sent := proto.Clone(spec).(*kvdirv1.WorkerSpec)
		n.cfg.Models = nil
		if onlyServed {
			n.cfg.Models = fuzzServed
		}
		n.fsm = raftfsm.New(raftfsm.Options{Logger: n.log})

		ctx, c := callAs(bearerOf(who, raw))
		cmd, token, epoch, err := n.registerNoRaft(ctx, &kvdirv1.RegisterRequest{Worker: spec}, 1)
		if want := wantRegister(c, sent, onlyServed); status.Code(err) != want {
			t.Fatalf("register %.300v as %+v: %.300v, want %v", sent, c, err, want)
		}
		if err != nil {
			checkRefusal(t, err, sent)
			return
		}
		texts := []string{id, addr, model}
		for k, v := range sent.Labels {
			texts = append(texts, k, v)
		}
		for _, s := range texts {
			if !printable(s) {
				t.Fatalf("accepted %q, which does not print", s)
			}
		}
		owner := ""
		if !c.admin {
			owner = fuzzCreds[c.cred].cred.Name
		}
		h := sha256.Sum256([]byte(token))
		if cmd.Owner != owner || cmd.Override != c.admin || !bytes.Equal(cmd.TokenHash, h[:]) || len(token) != 64 {
			t.Fatalf("command owner %q override %v token %q (hash %x); want owner %q override %v", cmd.Owner, cmd.Override, token, cmd.TokenHash, owner, c.admin)
		}
		if _, err := hex.DecodeString(token); err != nil {
			t.Fatalf("worker token %q: %v", token, err)
		}
		w, ok := n.fsm.Worker(id)
		if !ok || !proto.Equal(w.Spec, sent) || w.Epoch != epoch || w.Owner != owner {
			t.Fatalf("stored %.300v, want spec %.300v at epoch %d owned by %q", w, sent, epoch, owner)
		}

		// The same id again, by the administrator or a credential.
		var again string
		if k := int(who2) % (1 + len(fuzzCreds)); k == 0 {
			again = fuzzTokens.Admin
		} else {
			again = fuzzCreds[k-1].cred.Token
		}
		ctx2, c2 := callAs(again)
		_, _, epoch2, err := n.registerNoRaft(ctx2, &kvdirv1.RegisterRequest{Worker: proto.Clone(sent).(*kvdirv1.WorkerSpec)}, 2)
		owner2 := owner // an administrator acts for the owner
		want := codes.OK
		switch {
		case c2.admin:
		case !fuzzCreds[c2.cred].allows(id):
			want = codes.PermissionDenied // bound to other ids
		case owner == "" || owner == fuzzCreds[c2.cred].cred.Name:
			owner2 = fuzzCreds[c2.cred].cred.Name
		default:
			want = codes.PermissionDenied // live and owned by another
		}
		if status.Code(err) != want {
			t.Fatalf("%q registered by %q, then by %+v: %v, want %v", id, owner, c2, err, want)
		}
		if err != nil {
			checkRefusal(t, err, sent)
			return
		}
		if wa, _ := n.fsm.WorkerAuth(id); epoch2 <= epoch || wa.Owner != owner2 {
			t.Fatalf("re-registered at epoch %d (was %d) owned by %q, want %q", epoch2, epoch, wa.Owner, owner2)
		}
	})
}
