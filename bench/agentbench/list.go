package agentbench

import (
	"context"
	"fmt"
	"io"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/kvdir/kvdir/internal/tokenize"
	kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"
)

// ListOptions say which directory node to ask, and about which prompt.
type ListOptions struct {
	// Directory is a directory node's gRPC address.
	Directory string
	// Model is the served model (the namespace of the match).
	Model string
	// System is an optional system message; User the user message.
	System, User string
}

// List prints the directory's workers and a Match for a chat prompt
// (rendered with ChatML over cl100k, as the enginesim renders it).
func List(ctx context.Context, w io.Writer, o ListOptions) error {
	addr, model, system, user := o.Directory, o.Model, o.System, o.User
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("dial %s: %w", addr, err)
	}
	defer conn.Close()
	dirc := kvdirv1.NewDirectoryServiceClient(conn)
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	lw, err := dirc.ListWorkers(ctx, &kvdirv1.ListWorkersRequest{})
	if err != nil {
		return fmt.Errorf("list workers: %w", err)
	}
	mo := protojson.MarshalOptions{Multiline: true, Indent: "  "}
	fmt.Fprintf(w, "ListWorkers:\n%s\n", mo.Format(lw))
	tmpl, err := tokenize.ChatMLCL100K()
	if err != nil {
		return fmt.Errorf("tokenizer: %w", err)
	}
	var msgs []tokenize.Message
	if system != "" {
		msgs = append(msgs, tokenize.Message{Role: "system", Content: tokenize.TextContent(system)})
	}
	msgs = append(msgs, tokenize.Message{Role: "user", Content: tokenize.TextContent(user)})
	toks, err := tmpl.RenderChat(msgs, true)
	if err != nil {
		return fmt.Errorf("render: %w", err)
	}
	m, err := dirc.Match(ctx, &kvdirv1.MatchRequest{Query: &kvdirv1.MatchRequest_Tokens{Tokens: &kvdirv1.TokenQuery{
		TokenIds: toks, Namespace: &kvdirv1.Namespace{Model: model, BlockSize: 16}}}})
	if err != nil {
		return fmt.Errorf("match: %w", err)
	}
	fmt.Fprintf(w, "Match (%d prompt tokens, %d full blocks):\n%s\n", len(toks), len(toks)/16, mo.Format(m))
	return nil
}
