package node

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// Tokens are the bearer tokens of the three roles. When all are empty,
// authorisation is off (every call is allowed): fine on a laptop, not in a
// cluster.
//
//   - agent: register workers, and publish, heartbeat and deregister for a
//     worker it registered (those calls must also carry the worker token
//     that Register returned, in metadata "kvdir-worker-token");
//   - router: every directory read, recording sessions, and cluster status;
//   - admin: everything, including membership and draining workers.
type Tokens struct {
	Agent, Router, Admin string
}

func (t Tokens) enabled() bool { return t.Agent != "" || t.Router != "" || t.Admin != "" }

type role int

const (
	roleAgent role = 1 << iota
	roleRouter
	roleAdmin
)

// methodRoles says which roles may call each method. Methods not listed
// (health, reflection) need no token.
var methodRoles = map[string]role{
	"/kvdir.v1.AgentService/Register":   roleAgent,
	"/kvdir.v1.AgentService/Publish":    roleAgent,
	"/kvdir.v1.AgentService/Heartbeat":  roleAgent,
	"/kvdir.v1.AgentService/Deregister": roleAgent,

	"/kvdir.v1.DirectoryService/Match":          roleRouter,
	"/kvdir.v1.DirectoryService/ListWorkers":    roleRouter,
	"/kvdir.v1.DirectoryService/GetWorker":      roleRouter,
	"/kvdir.v1.DirectoryService/RecordSessions": roleRouter,
	"/kvdir.v1.DirectoryService/WhoHolds":       roleRouter,
	"/kvdir.v1.DirectoryService/ListSessions":   roleRouter,
	"/kvdir.v1.DirectoryService/WatchWorkers":   roleRouter,
	"/kvdir.v1.DirectoryService/Follow":         roleRouter,
	"/kvdir.v1.DirectoryService/Share":          roleRouter,

	"/kvdir.v1.AdminService/Status":             roleRouter,
	"/kvdir.v1.AdminService/AddMember":          0,
	"/kvdir.v1.AdminService/RemoveMember":       0,
	"/kvdir.v1.AdminService/TransferLeadership": 0,
	"/kvdir.v1.AdminService/Snapshot":           0,
	"/kvdir.v1.AdminService/DrainWorker":        0,
	"/kvdir.v1.AdminService/ExpireWorker":       0,
}

type authorizer struct {
	tokens Tokens
	key    []byte // HMAC key of worker tokens
}

func newAuthorizer(t Tokens) (*authorizer, error) {
	a := &authorizer{tokens: t}
	if t.enabled() && (t.Agent == "" || t.Router == "" || t.Admin == "") {
		return nil, errors.New("node: set all three role tokens (agent, router, admin) or none")
	}
	if t.Agent != "" {
		a.key = []byte("kvdir-worker-token:" + t.Agent)
	}
	return a, nil
}

// roles returns the roles the call's bearer token grants.
func (a *authorizer) roles(ctx context.Context) role {
	md, _ := metadata.FromIncomingContext(ctx)
	var r role
	for _, v := range md.Get("authorization") {
		tok, ok := strings.CutPrefix(v, "Bearer ")
		if !ok {
			continue
		}
		for _, c := range []struct {
			want string
			r    role
		}{{a.tokens.Agent, roleAgent}, {a.tokens.Router, roleRouter}, {a.tokens.Admin, roleAdmin}} {
			if subtle.ConstantTimeCompare([]byte(tok), []byte(c.want)) == 1 {
				r |= c.r
			}
		}
	}
	return r
}

func (a *authorizer) check(ctx context.Context, method string) error {
	if !a.tokens.enabled() {
		return nil
	}
	need, listed := methodRoles[method]
	if !listed {
		return nil
	}
	have := a.roles(ctx)
	switch {
	case have&roleAdmin != 0 || have&need != 0:
		return nil
	case have == 0:
		return status.Error(codes.Unauthenticated, "missing or unknown bearer token (metadata \"authorization: Bearer <token>\")")
	}
	return status.Errorf(codes.PermissionDenied, "this token's role may not call %s", method)
}

// workerToken is the token that binds an agent to the worker it registered.
func (a *authorizer) workerToken(id string) string {
	if a.key == nil {
		return ""
	}
	m := hmac.New(sha256.New, a.key)
	m.Write([]byte(id))
	return hex.EncodeToString(m.Sum(nil))
}

// checkWorker verifies that an agent's call carries the worker's token.
// Administrators may act for any worker.
func (a *authorizer) checkWorker(ctx context.Context, id string) error {
	if !a.tokens.enabled() || a.roles(ctx)&roleAdmin != 0 {
		return nil
	}
	md, _ := metadata.FromIncomingContext(ctx)
	want := a.workerToken(id)
	for _, v := range md.Get(MDWorkerToken) {
		if hmac.Equal([]byte(v), []byte(want)) {
			return nil
		}
	}
	return status.Errorf(codes.PermissionDenied, "no valid worker token for %q: an agent may act only for the worker it registered", id)
}

func (a *authorizer) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if err := a.check(ctx, info.FullMethod); err != nil {
		return nil, err
	}
	return h(ctx, req)
}

func (a *authorizer) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	if err := a.check(ss.Context(), info.FullMethod); err != nil {
		return err
	}
	return h(srv, ss)
}
