package node

import kvdirv1 "github.com/kvdir/kvdir/proto/kvdir/v1"

// ProposeNoop commits one entry that changes nothing (an empty loads
// command) through n, which must lead.
func ProposeNoop(n *Node) error {
	_, _, err := n.propose(kvdirv1.CommandType_COMMAND_TYPE_LOADS, &kvdirv1.LoadsCommand{})
	return err
}
