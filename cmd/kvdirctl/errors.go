package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvdir/kvdir/internal/dirclient"
)

// describe turns an error into a message that says what failed and what to
// try: the directory unreachable, no leader, authentication, a missing
// worker or session.
func describe(err error, a *app) string {
	var ue *dirclient.UnreachableError
	if errors.As(err, &ue) {
		return describeUnreachable(ue, a)
	}
	if errors.Is(err, context.Canceled) {
		return "interrupted"
	}
	var re *routerError
	if errors.As(err, &re) {
		return re.Error()
	}
	st, ok := grpcStatus(err)
	if !ok {
		return err.Error()
	}
	op := opOf(err)
	switch st.Code() {
	case codes.Unauthenticated:
		hint := "pass the token with --token-file FILE (or KVDIR_CTL_TOKEN / KVDIR_CTL_TOKEN_FILE)"
		if a.token != "" || a.tokenFile != "" {
			hint = "the token given is not one of the directory's tokens: check --token / --token-file"
		}
		return fmt.Sprintf("%s: the directory requires a bearer token (%s); %s", op, st.Message(), hint)
	case codes.PermissionDenied:
		return fmt.Sprintf("%s: permission denied (%s); changes such as drain, expire, members and snapshot need the admin token", op, st.Message())
	case codes.NotFound:
		hint := ""
		switch msg := st.Message(); {
		case strings.Contains(msg, "session"):
			hint = "; 'kvdirctl sessions --prefix ...' lists the recorded sessions"
		case strings.Contains(msg, "worker"):
			hint = "; 'kvdirctl workers --all' lists the workers the directory knows"
		}
		return fmt.Sprintf("%s: %s%s", op, st.Message(), hint)
	case codes.InvalidArgument, codes.FailedPrecondition:
		return fmt.Sprintf("%s: refused: %s", op, st.Message())
	case codes.Unavailable:
		if strings.Contains(st.Message(), "no leader") {
			return fmt.Sprintf("%s: the cluster has no leader (%s); a majority of the nodes may be down or an election is under way: "+
				"run 'kvdirctl status' to see each node, and retry", op, st.Message())
		}
		return fmt.Sprintf("%s: directory unavailable: %s; check --directory (%s)", op, st.Message(), strings.Join(a.directory, ","))
	case codes.DeadlineExceeded:
		return fmt.Sprintf("%s: no answer within --timeout %v (%s); the node may be overloaded: retry with a larger --timeout", op, a.timeout, st.Message())
	}
	return fmt.Sprintf("%s: %s: %s", op, st.Code(), st.Message())
}

// grpcStatus returns the innermost gRPC status in err's chain (status.FromError
// on a wrapping error puts the whole text in the message).
func grpcStatus(err error) (*status.Status, bool) {
	var found *status.Status
	for e := err; e != nil; e = errors.Unwrap(e) {
		if s, ok := status.FromError(e); ok && s.Code() != codes.Unknown && s.Code() != codes.OK {
			found = s
		}
	}
	return found, found != nil
}

// opOf returns the text of err before the first wrapped gRPC error, without
// the client's package prefix ("dirclient: list workers at 127.0.0.1:7001"
// becomes "list workers at 127.0.0.1:7001").
func opOf(err error) string {
	msg := err.Error()
	if i := strings.Index(msg, ": rpc error:"); i >= 0 {
		msg = msg[:i]
	}
	msg = strings.ReplaceAll(msg, "dirclient: ", "")
	if i := strings.Index(msg, ": not authenticated"); i >= 0 {
		msg = msg[:i]
	}
	if i := strings.Index(msg, ": permission denied"); i >= 0 {
		msg = msg[:i]
	}
	return msg
}

func describeUnreachable(ue *dirclient.UnreachableError, a *app) string {
	var b strings.Builder
	if ue.NoLeader {
		fmt.Fprintf(&b, "%s: the cluster has no leader: a majority of the nodes may be down, or an election is under way.\n", ue.Op)
		b.WriteString("  Run 'kvdirctl status' to see what each node reports, and retry in a few seconds.\n")
	} else {
		fmt.Fprintf(&b, "%s: no directory node answered within --timeout %v.\n", ue.Op, a.timeout)
	}
	addrs := make([]string, 0, len(ue.Attempts))
	for addr := range ue.Attempts {
		addrs = append(addrs, addr)
	}
	slices.SortFunc(addrs, func(x, y string) int {
		ix, iy := slices.Index(a.directory, x), slices.Index(a.directory, y)
		if ix < 0 {
			ix = len(a.directory)
		}
		if iy < 0 {
			iy = len(a.directory)
		}
		if ix != iy {
			return ix - iy
		}
		return strings.Compare(x, y)
	})
	for _, addr := range addrs {
		e := ue.Attempts[addr]
		if s, ok := status.FromError(e); ok {
			fmt.Fprintf(&b, "  %s: %s: %s\n", addr, s.Code(), s.Message())
		} else {
			fmt.Fprintf(&b, "  %s: %v\n", addr, e)
		}
	}
	if !ue.NoLeader {
		fmt.Fprintf(&b, "  Check that the nodes run and that --directory (or KVDIR_CTL_DIRECTORY) lists their gRPC API addresses "+
			"(now %s); for a TLS directory add --tls-ca.", strings.Join(a.directory, ","))
	}
	return strings.TrimRight(b.String(), "\n")
}
