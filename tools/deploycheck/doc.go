// Package deploycheck checks the container deployment of gpuproxy —
// docker-compose.yml (loaded with compose-go, the library docker compose
// itself uses), the Dockerfile and .dockerignore at the repository root —
// without a Docker engine. It is a module of its own so that compose-go
// and its dependencies stay out of the product's go.mod; CI runs it with
// `(cd tools/deploycheck && go test ./...)`.
package deploycheck
