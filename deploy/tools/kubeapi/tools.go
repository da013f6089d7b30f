//go:build tools

// Package kubeapi pins the API server make test-apiserver builds: go build
// k8s.io/kubernetes/cmd/kube-apiserver inside this module.
package kubeapi

import _ "k8s.io/kubernetes/cmd/kube-apiserver"
