package node

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"
	"unicode"
)

// Credential is an agent credential: a bearer token that grants the agent
// role for the worker ids its patterns match (path.Match globs; "*"
// matches every id, see Allows). The worker records it registers carry its name, and
// no other credential may take them over while they live.
type Credential struct {
	Name     string
	Token    string
	Patterns []string
}

// AgentTokenName is the name of the credential that Tokens.Agent stands
// for (pattern "*").
const AgentTokenName = "agent"

// Allows reports whether the credential may act for worker id. The
// pattern "*" matches every id; other patterns follow path.Match, whose
// '*' does not match '/' (so "pod-a-*" does not match "pod-a-1/dp0"; say
// "pod-a-*/*" too).
func (c *Credential) Allows(id string) bool {
	for _, p := range c.Patterns {
		if p == "*" {
			return true
		}
		if ok, err := path.Match(p, id); err == nil && ok {
			return true
		}
	}
	return false
}

// maxCredentials bounds a credentials file, and maxCredentialLine one of
// its lines.
const (
	maxCredentials    = 4096
	maxCredentialLine = 16 << 10
)

// ParseCredentials reads an agent credentials file: one credential a line,
// "NAME TOKEN PATTERN[,PATTERN...]" separated by spaces or tabs, with blank
// lines and lines starting with '#' ignored. Errors name the line. Names
// and tokens must be unique (CheckCredentials).
func ParseCredentials(r io.Reader) ([]Credential, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), maxCredentialLine)
	var out []Credential
	for line := 1; sc.Scan(); line++ {
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		fields := strings.Fields(text)
		if len(fields) != 3 {
			return nil, fmt.Errorf("line %d: want NAME TOKEN PATTERN[,PATTERN...], got %d fields", line, len(fields))
		}
		c := Credential{Name: fields[0], Token: fields[1], Patterns: strings.Split(fields[2], ",")}
		if err := checkCredential(c); err != nil {
			return nil, fmt.Errorf("line %d: %w", line, err)
		}
		if len(out) == maxCredentials {
			return nil, fmt.Errorf("line %d: more than %d credentials", line, maxCredentials)
		}
		out = append(out, c)
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, fmt.Errorf("a line is longer than %d bytes", maxCredentialLine)
		}
		return nil, fmt.Errorf("read credentials: %w", err)
	}
	if err := CheckCredentials(out); err != nil {
		return nil, err
	}
	return out, nil
}

// checkCredential checks one credential's fields.
func checkCredential(c Credential) error {
	if err := checkNodeID(c.Name); err != nil || c.Name == "" {
		return fmt.Errorf("credential name %q: want 1 to %d letters, digits, '.', '_' or '-'", c.Name, MaxIDLength)
	}
	if len(c.Token) < 16 {
		return fmt.Errorf("credential %q: the token is shorter than 16 characters", c.Name)
	}
	for _, r := range c.Token {
		if r > unicode.MaxASCII || !unicode.IsPrint(r) || unicode.IsSpace(r) {
			return fmt.Errorf("credential %q: the token must be printable ASCII without spaces", c.Name)
		}
	}
	if len(c.Patterns) == 0 {
		return fmt.Errorf("credential %q: no worker id pattern", c.Name)
	}
	for _, p := range c.Patterns {
		if p == "" {
			return fmt.Errorf("credential %q: empty worker id pattern", c.Name)
		}
		if _, err := path.Match(p, ""); err != nil {
			return fmt.Errorf("credential %q: pattern %q: %w", c.Name, p, err)
		}
	}
	return nil
}

// CheckCredentials checks a set of credentials: each well-formed, names
// and tokens unique.
func CheckCredentials(creds []Credential) error {
	names, tokens := map[string]bool{}, map[string]string{}
	for _, c := range creds {
		if err := checkCredential(c); err != nil {
			return err
		}
		if names[c.Name] {
			return fmt.Errorf("credential %q is defined twice", c.Name)
		}
		if other, dup := tokens[c.Token]; dup {
			return fmt.Errorf("credentials %q and %q have the same token", other, c.Name)
		}
		names[c.Name], tokens[c.Token] = true, c.Name
	}
	return nil
}

// agentCredentials merges the agent token (as the credential "agent",
// pattern "*") with the configured credentials, and checks them against
// each other and the router and admin tokens.
func agentCredentials(t Tokens, creds []Credential) ([]Credential, error) {
	all := make([]Credential, 0, len(creds)+1)
	if t.Agent != "" {
		all = append(all, Credential{Name: AgentTokenName, Token: t.Agent, Patterns: []string{"*"}})
	}
	for _, c := range creds {
		c.Patterns = append([]string(nil), c.Patterns...)
		all = append(all, c)
	}
	names, tokens := map[string]bool{}, map[string]string{}
	for _, c := range all {
		if names[c.Name] {
			if c.Name == AgentTokenName && t.Agent != "" {
				return nil, fmt.Errorf("credential %q: the name is taken by the agent token", c.Name)
			}
			return nil, fmt.Errorf("credential %q is defined twice", c.Name)
		}
		if other, dup := tokens[c.Token]; dup {
			return nil, fmt.Errorf("credentials %q and %q have the same token", other, c.Name)
		}
		switch c.Token {
		case "":
			return nil, fmt.Errorf("credential %q has no token", c.Name)
		case t.Router:
			return nil, fmt.Errorf("credential %q has the router token", c.Name)
		case t.Admin:
			return nil, fmt.Errorf("credential %q has the admin token", c.Name)
		}
		names[c.Name], tokens[c.Token] = true, c.Name
	}
	return all, nil
}
