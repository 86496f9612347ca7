// Package deployments holds no code: it is the home of the nats-server
// configurations, service units and Kubernetes manifests that run idemgate,
// and of the tests that load them with the real parsers (see README.md).
package deployments
