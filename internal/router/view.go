package router

import (
	"encoding/json"
	"fmt"
	"net/http"
)

// View is the answer of GET /v1/kvdir/view: whether the router follows
// the directory's log (--follow-log) and, if it does, where its replica
// stands. Two replicas, or a replica and a directory node, at the same
// applied index must have the same index digest.
type View struct {
	Following bool `json:"following"`
	// Source is what answers the router's matches now: local, local-stale
	// or directory (the labels of kvdir_router_matches_total).
	Source string `json:"source"`
	// The rest is set only when Following.
	Node         string  `json:"node,omitempty"` // the node streamed from ("" when not connected)
	Synced       bool    `json:"synced,omitempty"`
	StalenessMs  float64 `json:"staleness_ms,omitempty"`
	AppliedIndex uint64  `json:"applied_index,omitempty"`
	CommitIndex  uint64  `json:"commit_index,omitempty"`
	LagEntries   uint64  `json:"lag_entries"`
	// IndexDigest is the block index's digest, as a node's status reports
	// it; Digest covers the whole state (workers, sessions, members too).
	IndexDigest string `json:"index_digest,omitempty"`
	Digest      string `json:"digest,omitempty"`
	Snapshots   uint64 `json:"snapshots,omitempty"`
	// Groups, with several directory groups (--directory-group), is each
	// group's view, in flag order (the top level repeats the first's);
	// Conflicts names the models several groups claim.
	Groups    []GroupView `json:"groups,omitempty"`
	Conflicts []string    `json:"conflicts,omitempty"`
}

// GroupView is one directory group's part of View.
type GroupView struct {
	Name string `json:"name"`
	// ServedModels are the group's --models, as its nodes report them
	// (empty: every model; its workers say which).
	ServedModels []string `json:"served_models,omitempty"`
	View
}

// view reports the router's view of the directory: of its first group's
// at the top level (the only group, usually) and, with several groups,
// each group's in Groups.
func (s *Server) view() View {
	v := s.groupView(s.groups[0])
	if len(s.groups) > 1 {
		for _, g := range s.groups {
			gv := GroupView{Name: g.name, ServedModels: g.servedModels(), View: s.groupView(g)}
			v.Groups = append(v.Groups, gv)
		}
		v.Conflicts = s.conflictNotes()
	}
	return v
}

// groupView reports the router's view of g's directory.
func (s *Server) groupView(g *group) View {
	_, src := s.matcherFor(g)
	v := View{Source: src}
	l := g.local
	if l == nil {
		return v
	}
	r := l.View()
	v.Following, v.Node, v.Synced = true, r.Node, r.Synced
	if r.Synced {
		v.StalenessMs = float64(r.Staleness.Microseconds()) / 1e3
	}
	v.AppliedIndex, v.CommitIndex, v.LagEntries, v.Snapshots = r.AppliedIndex, r.CommitIndex, r.LagEntries, r.Snapshots
	v.IndexDigest, v.Digest = fmt.Sprintf("%016x", r.IndexDigest), fmt.Sprintf("%016x", r.Digest)
	return v
}

// serveView answers GET /v1/kvdir/view.
func (s *Server) serveView(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(s.view())
}
