package main

const helpSummary = `directory runs one node of the kvdir directory: a Raft-replicated record of
which LLM-serving worker holds which KV-cache prefix. It serves the gRPC API
(agent, directory and admin services) and HTTP (/metrics, /healthz, /readyz).

Every flag can also be given as an environment variable (shown beside it) or
as a key of a YAML config file named like the flag (node-id: n1; lists as
"a,b" or YAML sequences, --initial-cluster also as a mapping).`

const helpExamples = `  # A three-node cluster on one machine (one terminal each, or add &):
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

  # A fourth node joins the running cluster through any member's API:
  directory --node-id n4 --data-dir /tmp/kvdir/n4 \
    --raft-addr 127.0.0.1:7030 --api-addr 127.0.0.1:7031 --http-addr 127.0.0.1:7032 \
    --join 127.0.0.1:7001

  # With role tokens (all three or none) kept in files, and a config file:
  KVDIR_DIRECTORY_AGENT_TOKEN_FILE=/etc/kvdir/agent KVDIR_DIRECTORY_ROUTER_TOKEN_FILE=/etc/kvdir/router \
  KVDIR_DIRECTORY_ADMIN_TOKEN_FILE=/etc/kvdir/admin directory --config /etc/kvdir/n1.yaml

  # Each team's agents with their own token, bound to its worker ids (a file of
  # "NAME TOKEN PATTERN[,PATTERN...]" lines) instead of one shared agent token:
  KVDIR_DIRECTORY_ROUTER_TOKEN_FILE=/etc/kvdir/router KVDIR_DIRECTORY_ADMIN_TOKEN_FILE=/etc/kvdir/admin \
  directory --config /etc/kvdir/n1.yaml --agent-credentials /etc/kvdir/agents`

const helpNotes = `A new cluster forms from empty data directories, either one node with
--bootstrap (others --join it later) or several with the same
--initial-cluster. A node restarted on its data directory ignores both.

SIGINT or SIGTERM stops the node; a leader hands over leadership first. A
second signal, a second or more after the first, abandons the shutdown.
Exit status: 0 after a clean stop, 1 on an error, 2 on a usage error (bad
flag, environment variable or config file), 130 when a second signal
abandoned the shutdown.`
