package node_test

import (
	"strings"
	"testing"

	"github.com/kvdir/kvdir/internal/node"
)

func TestParseCredentials(t *testing.T) {
	_, err := node.ParseCredentials(strings.NewReader(`
# team A's agents
alice  alice-secret-0123456789  pod-a-*,a-*
	bob	bob-secret-0123456789	*   # trailing comment? no: a fourth field
`))
	if err == nil || !strings.Contains(err.Error(), "line 4") {
		t.Fatalf("a fourth field: %v, want an error naming line 4", err)
	}
	creds, err := node.ParseCredentials(strings.NewReader("# c\n\nalice alice-secret-0123456789 pod-a-*,a-*\n\tbob\tbob-secret-0123456789\t*\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(creds) != 2 || creds[0].Name != "alice" || len(creds[0].Patterns) != 2 || creds[1].Patterns[0] != "*" {
		t.Fatalf("parsed %+v", creds)
	}
	if !creds[0].Allows("pod-a-7") || creds[0].Allows("pod-b-7") || !creds[1].Allows("anything/at all") || creds[0].Allows("a-1/dp0") {
		t.Fatalf("patterns do not match as path.Match globs")
	}
	for _, tc := range []struct{ in, want string }{
		{"alice tok", "line 1: want NAME TOKEN PATTERN"},
		{"\n\nal/ice alice-secret-0123456789 *", "line 3: credential name"},
		{"alice short *", "line 1: credential \"alice\": the token is shorter"},
		{"alice alice-secret-0123456789 [a-", "line 1: credential \"alice\": pattern \"[a-\""},
		{"alice alice-secret-0123456789 a,,b", "empty worker id pattern"},
		{"alice alice-secret-0123456789 *\nalice other-secret-0123456789 *", "credential \"alice\" is defined twice"},
		{"alice alice-secret-0123456789 *\nbob alice-secret-0123456789 *", "credentials \"alice\" and \"bob\" have the same token"},
		{"alice alice-secret-é123456789 *", "printable ASCII"},
	} {
		_, err := node.ParseCredentials(strings.NewReader(tc.in))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want an error containing %q", tc.in, err, tc.want)
		}
	}
}

func TestCredentialsAgainstRoleTokens(t *testing.T) {
	base := node.DefaultConfig()
	base.ID, base.DataDir, base.Bootstrap = "n1", t.TempDir(), true
	base.Tokens = node.Tokens{Router: "router-secret-0123456789", Admin: "admin-secret-0123456789"}
	for _, tc := range []struct {
		name  string
		agent string
		creds []node.Credential
		want  string
	}{
		{"router token", "", []node.Credential{{Name: "a", Token: "router-secret-0123456789", Patterns: []string{"*"}}}, "has the router token"},
		{"admin token", "", []node.Credential{{Name: "a", Token: "admin-secret-0123456789", Patterns: []string{"*"}}}, "has the admin token"},
		{"agent name", "agent-secret-0123456789", []node.Credential{{Name: "agent", Token: "other-secret-0123456789", Patterns: []string{"*"}}}, "taken by the agent token"},
		{"agent token", "agent-secret-0123456789", []node.Credential{{Name: "a", Token: "agent-secret-0123456789", Patterns: []string{"*"}}}, "same token"},
		{"fine", "", []node.Credential{{Name: "a", Token: "a-secret-0123456789", Patterns: []string{"*"}}}, ""},
	} {
		cfg := base
		cfg.Tokens.Agent, cfg.AgentCredentials = tc.agent, tc.creds
		err := cfg.Validate()
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
	// Credentials without the router and admin tokens.
	cfg := base
	cfg.Tokens = node.Tokens{}
	cfg.AgentCredentials = []node.Credential{{Name: "a", Token: "a-secret-0123456789", Patterns: []string{"*"}}}
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "router and admin") {
		t.Errorf("credentials alone: %v", err)
	}
}

func FuzzParseCredentials(f *testing.F) {
	f.Add("alice alice-secret-0123456789 pod-a-*,a-*\n# c\n\nbob bob-secret-0123456789 *\n")
	f.Add("x y z")
	f.Add("a aaaaaaaaaaaaaaaa [\n")
	f.Add("a aaaaaaaaaaaaaaaa \\\n")
	f.Fuzz(func(t *testing.T, in string) {
		creds, err := node.ParseCredentials(strings.NewReader(in))
		if err != nil {
			if !strings.Contains(err.Error(), "line ") && !strings.Contains(err.Error(), "credential") {
				t.Fatalf("error %q names neither a line nor a credential", err)
			}
			return
		}
		if err := node.CheckCredentials(creds); err != nil {
			t.Fatalf("parsed credentials fail the check: %v", err)
		}
		names, toks := map[string]bool{}, map[string]bool{}
		for _, c := range creds {
			if names[c.Name] || toks[c.Token] {
				t.Fatalf("duplicate name or token in %+v", creds)
			}
			names[c.Name], toks[c.Token] = true, true
			if len(c.Patterns) == 0 {
				t.Fatalf("credential %q without patterns", c.Name)
			}
			for _, p := range c.Patterns {
				c.Allows(p) // a valid glob never fails; no panic
			}
			if strings.ContainsAny(c.Name+c.Token+strings.Join(c.Patterns, ","), " \t\r\n") {
				t.Fatalf("whitespace in a parsed field: %+v", c)
			}
		}
	})
}
