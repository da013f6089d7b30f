//go:build tools

// Package kubeapi pins what make test-apiserver needs: the API server (go
// build k8s.io/kubernetes/cmd/kube-apiserver inside this module) and the
// modules whose zips hold the upstream CustomResourceDefinitions the test
// loads (the Gateway API Inference Extension's InferencePool, Gateway
// API's Gateway, GatewayClass and HTTPRoute, the Prometheus Operator's
// ServiceMonitor). A CRD is a YAML file, which no import can name, so each
// of those modules is kept in go.mod by one package it holds, chosen for
// importing nothing outside the module graph already here; nothing builds
// them. The test reads the YAML files from the module cache.
package kubeapi

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"

	// Beside example/prometheus-operator-crd; imports only the standard
	// library.
	_ "github.com/prometheus-operator/prometheus-operator/example/alertmanager-webhook"
	_ "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	_ "sigs.k8s.io/gateway-api/apis/v1"
)
