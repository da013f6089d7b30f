package chaos

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// Credentials are what the harness presents to the compose cluster, which
// serves the directory's API over TLS and wants role tokens: the CA its
// members' certificates chain to, and the admin token (admin calls and
// reads alike). A nil *Credentials dials in plaintext without a token.
type Credentials struct {
	Dir   string // the secrets directory cluster.sh mounts (KVDIR_SECRETS)
	CA    *x509.CertPool
	Token string
	GID   int // group of the files, added to the kvdirctl container
}

// LoadCredentials reads the CA and the admin token that make
// deploy-secrets wrote into dir.
func LoadCredentials(dir string) (*Credentials, error) {
	ca, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if err != nil {
		return nil, fmt.Errorf("chaos credentials: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, fmt.Errorf("chaos credentials: %s/ca.crt holds no certificate", dir)
	}
	tok, err := os.ReadFile(filepath.Join(dir, "admin.token"))
	if err != nil {
		return nil, fmt.Errorf("chaos credentials: %w", err)
	}
	c := &Credentials{Dir: dir, CA: pool, Token: strings.TrimSpace(string(tok))}
	if st, err := os.Stat(filepath.Join(dir, "admin.token")); err == nil {
		if sys, ok := st.Sys().(*syscall.Stat_t); ok {
			c.GID = int(sys.Gid)
		}
	}
	return c, nil
}

// dialOptions dial a member whose certificate names it serverName (its
// container name: the harness dials containers by their addresses).
func (c *Credentials) dialOptions(serverName string) []grpc.DialOption {
	if c == nil {
		return []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: c.CA, ServerName: serverName}
	return []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(tc)), grpc.WithPerRPCCredentials(bearer(c.Token))}
}

// kvdirctl returns the docker run flags (before the image) and the
// kvdirctl flags (after it) that give kvdirctl the CA and the admin token.
func (c *Credentials) kvdirctl() (docker, ctl []string) {
	if c == nil {
		return nil, nil
	}
	docker = []string{"--group-add", fmt.Sprint(c.GID),
		"-v", filepath.Join(c.Dir, "ca.crt") + ":/etc/kvdir/tls/ca.crt:ro",
		"-v", filepath.Join(c.Dir, "admin.token") + ":/etc/kvdir/tokens/admin:ro"}
	ctl = []string{"--tls-ca", "/etc/kvdir/tls/ca.crt", "--token-file", "/etc/kvdir/tokens/admin"}
	return docker, ctl
}

// bearer sends the token as "authorization: Bearer <token>", over TLS only.
type bearer string

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}

func (bearer) RequireTransportSecurity() bool { return true }
