package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"strings"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/reflection"

	"github.com/kvdir/kvdir/internal/httpserve"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// maxMessage bounds gRPC messages: a batch of a million blocks fits.
const maxMessage = 64 << 20

func (n *Node) startGRPC() error {
	lis, err := net.Listen("tcp", n.cfg.APIAddr)
	if err != nil {
		return fmt.Errorf("node: listen for gRPC on %s: %w", n.cfg.APIAddr, err)
	}
	n.apiLis = lis
	if n.cfg.APIAdvertise == "" || n.cfg.APIAdvertise == n.cfg.APIAddr {
		n.cfg.APIAdvertise = advertise(lis.Addr(), n.cfg.APIAdvertise)
	}
	opts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(maxMessage),
		// Clients may ping idle connections every 10 s to notice dead peers.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		grpc.MaxSendMsgSize(maxMessage),
		grpc.ChainUnaryInterceptor(n.metrics.unary, n.auth.unary, n.memberUnary, n.leaderHeaderUnary),
		grpc.ChainStreamInterceptor(n.metrics.stream, n.auth.stream, n.memberStream, n.leaderHeaderStream),
	}
	if n.cfg.TLS != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(n.cfg.TLS)))
	}
	s := grpc.NewServer(opts...)
	kvdirv1.RegisterAgentServiceServer(s, &agentService{n: n})
	kvdirv1.RegisterDirectoryServiceServer(s, &directoryService{n: n})
	kvdirv1.RegisterAdminServiceServer(s, &adminService{n: n})
	hs := health.NewServer()
	healthpb.RegisterHealthServer(s, hs)
	reflection.Register(s)
	n.grpc = s
	go func() {
		if err := s.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			n.log.Error("gRPC server stopped", "err", err)
		}
	}()
	return nil
}

// advertise turns a listener's address into one others can dial: a
// wildcard host becomes 127.0.0.1 unless an advertised address was given.
func advertise(a net.Addr, given string) string {
	if given != "" {
		if host, _, err := net.SplitHostPort(given); err == nil && host != "" && host != "0.0.0.0" && host != "::" {
			if _, port, _ := net.SplitHostPort(a.String()); port != "" {
				return net.JoinHostPort(host, port)
			}
		}
	}
	tcp, ok := a.(*net.TCPAddr)
	if ok && (tcp.IP == nil || tcp.IP.IsUnspecified()) {
		return fmt.Sprintf("127.0.0.1:%d", tcp.Port)
	}
	return a.String()
}

// memberCheck refuses calls (but Status, which says why) on a node whose
// state has stopped following the log: it stopped at an entry it cannot
// decode, its Raft stopped, or, for reads, it
// has not heard from a leader for longer than MaxStaleness (cut off, or
// removed from the cluster without learning it). Writes are not refused
// here: they are forwarded or fail on their own.
func (n *Node) memberCheck(method string) error {
	if !strings.HasPrefix(method, "/kvdir.v1.") || method == "/kvdir.v1.AdminService/Status" {
		return nil
	}
	if err := n.Err(); err != nil {
		return status.Errorf(codes.Unavailable, "%v; use another node", err)
	}
	switch n.raft.State() {
	case raft.Leader:
		return nil
	case raft.Shutdown:
		return status.Error(codes.Unavailable, "this node's Raft has stopped (removed from the cluster?); use another node")
	}
	if !strings.HasPrefix(method, "/kvdir.v1.DirectoryService/") || method == "/kvdir.v1.DirectoryService/RecordSessions" {
		return nil
	}
	if last := n.raft.LastContact(); !last.IsZero() && time.Since(last) > n.cfg.MaxStaleness {
		return status.Errorf(codes.Unavailable, "this node last heard from a leader %v ago (more than %v): its answers would be stale; use another node",
			time.Since(last).Round(time.Millisecond), n.cfg.MaxStaleness)
	}
	return nil
}

func (n *Node) memberUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if err := n.memberCheck(info.FullMethod); err != nil {
		return nil, err
	}
	return h(ctx, req)
}

func (n *Node) memberStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	if err := n.memberCheck(info.FullMethod); err != nil {
		return err
	}
	return h(srv, ss)
}

// leaderHeader tells clients where the leader's API is.
func (n *Node) leaderHeader(ctx context.Context) {
	if addr, ok := n.leaderAPI(); ok {
		grpc.SetHeader(ctx, metadata.Pairs(MDLeader, addr))
	}
}

func (n *Node) leaderHeaderUnary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	n.leaderHeader(ctx)
	return h(ctx, req)
}

func (n *Node) leaderHeaderStream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	n.leaderHeader(ss.Context())
	return h(srv, ss)
}

func (n *Node) startHTTP() error {
	if n.cfg.HTTPAddr == "" {
		return nil
	}
	lis, err := net.Listen("tcp", n.cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("node: listen for HTTP on %s: %w", n.cfg.HTTPAddr, err)
	}
	n.httpLis = lis
	mux := http.NewServeMux()
	gatherer, ok := n.cfg.Registerer.(prometheus.Gatherer)
	if !ok {
		gatherer = prometheus.DefaultGatherer
	}
	mux.Handle("/metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if err := n.ready(); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	if n.cfg.Pprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	n.http = httpserve.New(mux, httpserve.Timeouts{Idle: n.cfg.HTTPIdleTimeout}, slog.NewLogLogger(n.log.Handler(), slog.LevelWarn))
	go func() {
		if err := httpserve.Serve(n.http, lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			n.log.Error("HTTP server stopped", "err", err)
		}
	}()
	return nil
}

// ready reports why the node should not get traffic, if it should not:
// stopped at an undecodable log entry, no leader known, its state far behind the commit index, or a recent write
// failure (a full or failing disk).
func (n *Node) ready() error {
	if err := n.Err(); err != nil {
		return err
	}
	if _, id := n.raft.LeaderWithID(); id == "" {
		return errors.New("no leader known")
	}
	if err := n.catchUpErr(); err != nil {
		return err
	}
	if err := n.writeErr.get(); err != nil {
		return fmt.Errorf("writes failing: %v", err)
	}
	return nil
}
