// Package deploycheck checks the deployments of gpuproxy without running
// them:
//
//   - the container deployment — docker-compose.yml (loaded with
//     compose-go, the library docker compose itself uses), the Dockerfile
//     and .dockerignore at the repository root — without a Docker engine;
//   - the Kubernetes manifests under deploy/kubernetes — every
//     kustomization rendered with kustomize's engine (and with `kubectl
//     kustomize` where kubectl is installed), decoded strictly into the
//     Kubernetes API types and checked against the product's own source
//     (route table, configuration, shutdown timeouts, Dockerfile) —
//     without a cluster.
//
// It is a module of its own so that compose-go, the Kubernetes API types
// and kustomize stay out of the product's go.mod; CI runs it with
// `(cd tools/deploycheck && go test ./...)`.
package deploycheck
