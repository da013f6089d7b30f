package main

import (
	"fmt"
	"io"
	"strings"
)

const helpHeader = `directory runs one node of the kvdir directory: a Raft-replicated record of
which LLM-serving worker holds which KV-cache prefix. It serves the gRPC API
(agent, directory and admin services) and HTTP (/metrics, /healthz, /readyz).

Usage:
  directory --node-id ID [flags]

Every flag can also be given as an environment variable (KVDIR_ and the
flag's name in capitals, dashes as underscores: --node-id is KVDIR_NODE_ID; an
empty variable counts as unset) or as a key of a YAML config file named like
the flag (node-id: n1; lists as "a,b" or YAML sequences). A flag beats the
environment, which beats the config file, which beats the default.

  --config FILE  (KVDIR_CONFIG)
      YAML file of settings; an unknown key is an error
  --version
      print the version and exit
  --help
      print this help and exit
`

const helpFooter = `
A new cluster forms from empty data directories, either one node with
--bootstrap (others --join it later) or several with the same
--initial-cluster. A node restarted on its data directory ignores both.

Example: a three-node cluster on one machine (one terminal each, or add &):

  directory --node-id n1 --data-dir /tmp/kvdir/n1 \
    --raft-addr 127.0.0.1:7000 --api-addr 127.0.0.1:7001 --http-addr 127.0.0.1:7002 \
    --initial-cluster n1=127.0.0.1:7000,n2=127.0.0.1:7010,n3=127.0.0.1:7020
  directory --node-id n2 --data-dir /tmp/kvdir/n2 \
    --raft-addr 127.0.0.1:7010 --api-addr 127.0.0.1:7011 --http-addr 127.0.0.1:7012 \
    --initial-cluster n1=127.0.0.1:7000,n2=127.0.0.1:7010,n3=127.0.0.1:7020
  directory --node-id n3 --data-dir /tmp/kvdir/n3 \
    --raft-addr 127.0.0.1:7020 --api-addr 127.0.0.1:7021 --http-addr 127.0.0.1:7022 \
    --initial-cluster n1=127.0.0.1:7000,n2=127.0.0.1:7010,n3=127.0.0.1:7020

  curl -s http://127.0.0.1:7002/readyz     # "ready" once a leader is known

A fourth node joins the running cluster through any member's API:

  directory --node-id n4 --data-dir /tmp/kvdir/n4 \
    --raft-addr 127.0.0.1:7030 --api-addr 127.0.0.1:7031 --http-addr 127.0.0.1:7032 \
    --join 127.0.0.1:7001

With role tokens (all three or none), keep them in files or the environment:

  KVDIR_AGENT_TOKEN_FILE=/etc/kvdir/agent KVDIR_ROUTER_TOKEN_FILE=/etc/kvdir/router \
  KVDIR_ADMIN_TOKEN_FILE=/etc/kvdir/admin directory --config /etc/kvdir/n1.yaml

SIGINT or SIGTERM stops the node; a leader hands over leadership first.
Exit status: 0 after a clean stop, 1 on an error, 2 on a usage error.
`

// writeHelp writes --help: every option by group, with its environment
// variable and default.
func writeHelp(w io.Writer) {
	var b strings.Builder
	b.WriteString(helpHeader)
	for _, g := range groups {
		fmt.Fprintf(&b, "\n%s:\n", g)
		for _, o := range options {
			if o.group != g {
				continue
			}
			head := "  --" + o.name
			if o.arg != "" {
				head += " " + o.arg
			}
			fmt.Fprintf(&b, "%s  (%s)\n      %s", head, o.env(), o.usage)
			if o.def != "" && o.arg != "" {
				fmt.Fprintf(&b, " (default %s)", o.def)
			}
			b.WriteString("\n")
		}
	}
	b.WriteString(helpFooter)
	io.WriteString(w, b.String())
}
