// Package ctlview is the machine-readable output of kvdirctl: the documents
// its commands print with -o json or -o yaml (YAML has the same keys, see
// internal/clitable). It is a stable contract for scripts: a field's JSON
// name and meaning do not change; new fields may be added.
//
// kvdirctl fills these types; a Go program that runs kvdirctl (the system
// tests in e2e/, a script's helper) decodes its output into them. The
// exception is "kvdirctl explain", whose document is the router's own
// (router.Explanation).
//
// Numbers that come from elsewhere (a worker's load) or are computed from
// them are clitable.Float: null in JSON and YAML when not finite (NaN or
// infinite), so that one bad value cannot break a document.
package ctlview

import "github.com/kvdir/kvdir/internal/clitable"

// Status is what "kvdirctl status" prints.
type Status struct {
	Leader        string      `json:"leader"`
	LeaderAddress string      `json:"leader_address"`
	Term          uint64      `json:"term"`
	Nodes         []Node      `json:"nodes"`
	Counters      *Counters   `json:"counters,omitempty"`
	CountersFrom  string      `json:"counters_from,omitempty"`
	Digests       DigestCheck `json:"digests"`
	// CacheMismatches are the workers the misconfiguration check flags
	// (internal/cachecheck), from their directory accounting.
	CacheMismatches []CacheMismatch `json:"cache_mismatches"`
	// CacheCheckError says why the workers could not be read for it.
	CacheCheckError string `json:"cache_check_error,omitempty"`
	// BlockSizeMismatches are the live workers whose agent was told a
	// block size (--block-size) other than the ones their engine's events
	// show.
	BlockSizeMismatches []BlockSizeMismatch `json:"block_size_mismatches,omitempty"`
	// Routers are the routers connected to the nodes' Share streams
	// (placement intents), by id; RouterDigests compares the replicas of
	// those that follow the log (router --follow-log) with the nodes.
	Routers       []Router     `json:"routers,omitempty"`
	RouterDigests *DigestCheck `json:"router_digests,omitempty"`
}

// Router is a router as the node it is connected to reports it.
type Router struct {
	ID   string `json:"id"`
	Node string `json:"node"`
	// Follows says the router keeps a replica of the directory; Synced
	// that it has a state to answer from. The fields after them describe
	// the replica.
	Follows      bool           `json:"follows"`
	Synced       bool           `json:"synced"`
	AppliedIndex uint64         `json:"applied_index,omitempty"`
	LagEntries   uint64         `json:"lag_entries"`
	HeardAgeMs   clitable.Float `json:"heard_age_ms"`
	// Digest is the replica's index digest (comparable with a node's
	// digest at the same applied index), StateDigest its state digest
	// (raftfsm.FSM.Digest, what the nodes compare).
	Digest      string `json:"digest,omitempty"`
	StateDigest string `json:"state_digest,omitempty"`
	// ReportAgeMs is how long ago the node last heard from the router;
	// Intents how many of its placement intents the node holds.
	ReportAgeMs clitable.Float `json:"report_age_ms"`
	Intents     uint64         `json:"intents"`
	// The node's comparison of the router's digest with its own at the
	// router's applied index, when it made one.
	DigestChecked     bool   `json:"digest_checked"`
	CheckedIndex      uint64 `json:"checked_index,omitempty"`
	CheckedDigest     string `json:"checked_router_digest,omitempty"`
	CheckedNodeDigest string `json:"checked_node_digest,omitempty"`
}

// BlockSizeMismatch is a worker registered with one block size whose
// events show others.
type BlockSizeMismatch struct {
	Worker string `json:"worker"`
	// Registered is the agent's --block-size; Learned the block sizes of
	// the blocks the worker publishes.
	Registered uint32   `json:"registered_block_size"`
	Learned    []uint32 `json:"learned_block_sizes"`
	// Detail names the likely cause and the fix.
	Detail string `json:"detail"`
}

// Node is one member as it reports itself.
type Node struct {
	ID                string         `json:"id"`
	APIAddress        string         `json:"api_address"`
	RaftAddress       string         `json:"raft_address"`
	Voter             bool           `json:"voter"`
	State             string         `json:"state"`
	Term              uint64         `json:"term,omitempty"`
	CommitIndex       uint64         `json:"commit_index,omitempty"`
	AppliedIndex      uint64         `json:"applied_index,omitempty"`
	LastLogIndex      uint64         `json:"last_log_index,omitempty"`
	Lag               int64          `json:"lag"`
	LastContactMs     clitable.Float `json:"last_contact_ms"`
	Digest            string         `json:"digest,omitempty"`
	LastSnapshotIndex uint64         `json:"last_snapshot_index,omitempty"`
	Counters          *Counters      `json:"counters,omitempty"`
	WriteError        string         `json:"write_error,omitempty"`
	Error             string         `json:"error,omitempty"`
}

// Counters are the sizes of a node's index.
type Counters struct {
	Workers      uint64 `json:"workers"`
	Blocks       uint64 `json:"blocks"`
	Entries      uint64 `json:"entries"`
	StoredBlocks uint64 `json:"stored_blocks"`
	OrphanBlocks uint64 `json:"orphan_blocks"`
	ApproxBytes  uint64 `json:"approx_bytes"`
	Sessions     uint64 `json:"sessions"`
}

// DigestCheck says whether the members' index digests agree.
type DigestCheck struct {
	// Agree is true when every node at Index has the same digest and every
	// reachable node is at Index.
	Agree bool `json:"agree"`
	// Comparable is false when the nodes were at different applied indexes
	// each time they were asked (writes kept arriving).
	Comparable bool   `json:"comparable"`
	Index      uint64 `json:"applied_index"`
	Nodes      int    `json:"nodes_compared"`
	Detail     string `json:"detail"`
}

// WorkerList is what "kvdirctl workers" prints.
type WorkerList struct {
	Workers []Worker `json:"workers"`
	Read    Read     `json:"read"`
}

// WorkerDetail is what "kvdirctl workers get" prints.
type WorkerDetail struct {
	Worker Worker  `json:"worker"`
	Chains []Chain `json:"chains"`
	Read   Read    `json:"read"`
}

// Worker is one worker as kvdirctl shows it.
type Worker struct {
	// Group is the directory group the worker is in, with several
	// (kvdirctl --directory-group); omitted with one.
	Group     string `json:"group,omitempty"`
	ID        string `json:"id"`
	Address   string `json:"address"`
	Model     string `json:"model"`
	Engine    string `json:"engine"`
	BlockSize uint32 `json:"block_size"` // as registered (0: its agent was not told one)
	// BlockSizes are the block sizes learned from the worker's events (the
	// ones routers hash with); Groups its KV-cache groups. Empty until its
	// agent sent a layout in the current epoch.
	BlockSizes []uint32  `json:"block_sizes,omitempty"`
	Groups     []KVGroup `json:"groups,omitempty"`
	// DataParallelRank is the engine rank the worker is behind an API
	// server shared with the other ranks; absent for a worker that is its
	// own server.
	DataParallelRank *uint32         `json:"data_parallel_rank,omitempty"`
	State            string          `json:"state"`
	Epoch            uint64          `json:"epoch"`
	AppliedSeq       uint64          `json:"applied_seq"`
	Blocks           uint64          `json:"blocks"`
	GPUBlocks        uint64          `json:"gpu_blocks"`
	CPUBlocks        uint64          `json:"cpu_blocks"`
	DiskBlocks       uint64          `json:"disk_blocks"`
	RemoteBlocks     uint64          `json:"remote_blocks"`
	KVUsage          clitable.Float  `json:"kv_usage"`
	KVBlocks         uint64          `json:"kv_blocks"`
	Running          uint32          `json:"running"`
	Waiting          uint32          `json:"waiting"`
	PrefixQueries    uint64          `json:"prefix_queries"`
	PrefixHits       uint64          `json:"prefix_hits"`
	HeartbeatAge     *clitable.Float `json:"heartbeat_age_seconds"`
	// ViewPartial: its agent could not rebuild its view from the engine
	// at its latest registration, so the index may miss blocks it holds.
	ViewPartial bool              `json:"view_partial,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	// Owner is the agent credential that registered it (absent when the
	// directory enforces no roles).
	Owner string `json:"owner,omitempty"`
	// BlockQuota is the most blocks it may hold (0: no bound);
	// DroppedBlocks the blocks its events stored past it in this epoch,
	// which the directory did not keep.
	BlockQuota    uint64 `json:"block_quota,omitempty"`
	DroppedBlocks uint64 `json:"dropped_blocks,omitempty"`
}

// KVGroup is one KV-cache group of a worker, as its events describe it.
type KVGroup struct {
	Index         uint32 `json:"index"`
	Kind          string `json:"kind"`
	BlockSize     uint32 `json:"block_size"`
	SlidingWindow uint32 `json:"sliding_window,omitempty"`
	// Indexed says whether its blocks enter the directory.
	Indexed bool `json:"indexed"`
}

// Chain is one chain a worker holds.
type Chain struct {
	Tail     string   `json:"tail"`
	Blocks   uint32   `json:"blocks"`
	Tokens   uint64   `json:"tokens"`
	Sessions []string `json:"sessions,omitempty"`
}

// Read says which node answered a read and how fresh it was.
type Read struct {
	Node         string         `json:"node"`
	AppliedIndex uint64         `json:"applied_index"`
	StalenessMs  clitable.Float `json:"staleness_ms"`
	FromLeader   bool           `json:"from_leader"`
}

// Match is what "kvdirctl match" prints.
type Match struct {
	Model        string     `json:"model"`
	PromptKind   string     `json:"prompt_kind"`
	PromptTokens int        `json:"prompt_tokens"`
	CacheSalt    string     `json:"cache_salt,omitempty"`
	LoRA         string     `json:"lora,omitempty"`
	Workers      []MatchRow `json:"workers"`
	Read         []Read     `json:"read"`
}

// MatchRow is one worker's match of a prompt.
type MatchRow struct {
	Worker        string         `json:"worker"`
	State         string         `json:"state"`
	BlockSize     uint32         `json:"block_size"`
	ChainBlocks   int            `json:"chain_blocks"`
	MatchedBlocks uint32         `json:"matched_blocks"`
	MatchedTokens uint64         `json:"matched_tokens"`
	HitTokens     uint64         `json:"hit_tokens"`
	Percent       clitable.Float `json:"percent"`
	GPUBlocks     uint32         `json:"gpu_blocks"`
	CPUBlocks     uint32         `json:"cpu_blocks"`
	DiskBlocks    uint32         `json:"disk_blocks"`
	RemoteBlocks  uint32         `json:"remote_blocks"`
}

// SessionList is what "kvdirctl sessions" prints.
type SessionList struct {
	Sessions []Session `json:"sessions"`
	Total    uint64    `json:"total"`
	Read     Read      `json:"read"`
}

// Session is one recorded session.
type Session struct {
	// Group is the directory group the session is recorded in, with
	// several; omitted with one.
	Group        string          `json:"group,omitempty"`
	ID           string          `json:"session_id"`
	Worker       string          `json:"worker"`
	PromptTokens uint32          `json:"prompt_tokens"`
	CachedTokens uint32          `json:"cached_tokens"`
	Blocks       uint32          `json:"blocks"`
	BlockSize    uint32          `json:"block_size"`
	Tail         string          `json:"tail"`
	LastSeen     string          `json:"last_seen,omitempty"`
	AgeSeconds   *clitable.Float `json:"age_seconds"`
}

// WhoHoldsList is what "kvdirctl who-holds --prefix" prints.
type WhoHoldsList struct {
	Sessions []WhoHolds `json:"sessions"`
	Read     Read       `json:"read"`
}

// WhoHolds is one session's holders and placement: what "kvdirctl
// who-holds SESSION" prints.
type WhoHolds struct {
	Session      Session     `json:"session"`
	ChainTokens  uint64      `json:"chain_tokens"`
	Connected    bool        `json:"connected"`
	Holders      []Holder    `json:"holders"`
	Model        string      `json:"model"`
	Profile      string      `json:"profile"`
	PromptTokens int         `json:"prompt_tokens"`
	Pick         string      `json:"pick"`
	Placement    []Placement `json:"placement"`
	Note         string      `json:"note,omitempty"`
}

// Holder is how much of a session's chain one worker holds.
type Holder struct {
	Worker       string         `json:"worker"`
	State        string         `json:"state"`
	Blocks       uint32         `json:"blocks"`
	Tokens       uint64         `json:"tokens"`
	Percent      clitable.Float `json:"percent"`
	GPUBlocks    uint32         `json:"gpu_blocks"`
	CPUBlocks    uint32         `json:"cpu_blocks"`
	DiskBlocks   uint32         `json:"disk_blocks"`
	RemoteBlocks uint32         `json:"remote_blocks"`
}

// Placement is one candidate's expected time to first token under the
// kvdir cost model, and its difference from the pick's.
type Placement struct {
	Worker        string         `json:"worker"`
	MatchedTokens int            `json:"matched_tokens"`
	Retain        clitable.Float `json:"retain"`
	CachedTokens  clitable.Float `json:"cached_tokens"`
	Running       int            `json:"running"`
	Waiting       int            `json:"waiting"`
	KVUsage       clitable.Float `json:"kv_usage"`
	QueueMs       clitable.Float `json:"queue_ms"`
	InterfMs      clitable.Float `json:"interference_ms"`
	WaitMs        clitable.Float `json:"wait_ms"`
	PrefillMs     clitable.Float `json:"prefill_ms"`
	ColdPrefillMs clitable.Float `json:"cold_prefill_ms"`
	TTFTMs        clitable.Float `json:"ttft_ms"`
	VsPickMs      clitable.Float `json:"vs_pick_ms"`
	Pick          bool           `json:"pick"`
	Current       bool           `json:"current"`
}

// MemberList is what "kvdirctl members list" prints.
type MemberList struct {
	Members []Member `json:"members"`
	From    string   `json:"from"`
}

// Member is one Raft member.
type Member struct {
	ID          string `json:"id"`
	RaftAddress string `json:"raft_address"`
	APIAddress  string `json:"api_address"`
	Voter       bool   `json:"voter"`
	Leader      bool   `json:"leader"`
}

// SnapshotList is what "kvdirctl snapshot" prints.
type SnapshotList struct {
	Snapshots []Snapshot `json:"snapshots"`
}

// Snapshot is one node's snapshot.
type Snapshot struct {
	Node    string `json:"node"`
	Address string `json:"address"`
	Index   uint64 `json:"index,omitempty"`
	Term    uint64 `json:"term,omitempty"`
	Error   string `json:"error,omitempty"`
}

// Change is what a command that changes the cluster prints: drain,
// expire, members add and remove, leader transfer.
type Change struct {
	Action    string `json:"action"`
	Target    string `json:"target"`
	RaftIndex uint64 `json:"raft_index,omitempty"`
	Detail    string `json:"detail,omitempty"`
}
