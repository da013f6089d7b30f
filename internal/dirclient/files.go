package dirclient

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"strings"
)

// LoadTLS returns the TLS configuration to dial the directory with: the
// nodes' certificates must chain to a CA in caFile (a PEM bundle), and are
// checked against serverName, or the host of each address if it is empty.
func LoadTLS(caFile, serverName string) (*tls.Config, error) {
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("read the directory CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("directory CA %s: no PEM certificate in it", caFile)
	}
	return &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool, ServerName: serverName}, nil
}

// ReadToken returns the bearer token held in file, surrounding white space
// removed; an empty file is an error.
func ReadToken(file string) (string, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("read the token file: %w", err)
	}
	t := strings.TrimSpace(string(b))
	if t == "" {
		return "", fmt.Errorf("token file %s is empty", file)
	}
	return t, nil
}

// Security is how a command reaches the directory: a bearer token given
// inline or in a file, and a CA (with an optional server name) for TLS.
type Security struct {
	Token, TokenFile, CAFile, ServerName string
}

// Load returns the token and the TLS configuration (nil: plaintext) that s
// names. The errors name the flags --token, --token-file, --tls-ca and
// --tls-server-name, which every command spells the same way.
func (s Security) Load() (string, *tls.Config, error) {
	token := s.Token
	if s.TokenFile != "" {
		if token != "" {
			return "", nil, fmt.Errorf("give --token or --token-file, not both")
		}
		t, err := ReadToken(s.TokenFile)
		if err != nil {
			return "", nil, fmt.Errorf("--token-file: %w", err)
		}
		token = t
	}
	if s.ServerName != "" && s.CAFile == "" {
		return "", nil, fmt.Errorf("--tls-server-name needs --tls-ca")
	}
	if s.CAFile == "" {
		return token, nil, nil
	}
	tc, err := LoadTLS(s.CAFile, s.ServerName)
	if err != nil {
		return "", nil, fmt.Errorf("--tls-ca: %w", err)
	}
	return token, tc, nil
}
