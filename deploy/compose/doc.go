// Package compose holds the local compose cluster (docker-compose.yml, its
// two-group overlay groups.yml, cluster.sh and demo.sh) and the test that
// renders each variant with docker-compose config and cross-checks it: each
// directory group's nodes list each other and only each other as their
// Raft membership, every agent registers with the group serving its model,
// and every router names every group. deploy/README.md describes the
// cluster.
package compose
