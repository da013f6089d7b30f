package node

// Internals the tests of package node_test need.

// LeaderAPI is n.leaderAPI: the leader's API address, if n knows it.
func LeaderAPI(n *Node) (string, bool) { return n.leaderAPI() }

// Ready is n.ready: nil when n reports ready on /readyz.
func Ready(n *Node) error { return n.ready() }
