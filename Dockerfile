# gpuproxy container image.
#
#   docker build -t gpuproxy --build-arg VERSION=$(git describe --tags --always) .
#
# Stage 1 compiles a static binary (CGO_ENABLED=0: the SQLite driver is pure
# Go); stage 2 is a slim Debian runtime that runs it as a non-root user. The
# runtime keeps curl for the HEALTHCHECK and ca-certificates for the HTTPS
# calls to the GPU providers.

ARG GO_VERSION=1.26

FROM golang:${GO_VERSION}-bookworm AS build
WORKDIR /src
ENV CGO_ENABLED=0

# Dependencies first, so this layer is cached until go.mod/go.sum change.
COPY go.mod go.sum ./
RUN go mod download && go mod verify

COPY . .
ARG VERSION=dev
RUN go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/gpuproxy ./cmd/gpuproxy

FROM debian:bookworm-slim AS runtime
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl \
 && rm -rf /var/lib/apt/lists/*
RUN groupadd --system --gid 10001 gpuproxy \
 && useradd --system --uid 10001 --gid gpuproxy --home-dir /app --no-create-home --shell /usr/sbin/nologin gpuproxy \
 && mkdir -p /app/data \
 && chown -R gpuproxy:gpuproxy /app
# /app is the working directory so that, without DATABASE_URL, the SQLite
# fallback (data/gpuproxy.db) lands in a folder the service may write.
WORKDIR /app
COPY --from=build /out/gpuproxy /gpuproxy
USER 10001:10001
EXPOSE 8080
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
  CMD ["curl", "-fsS", "-o", "/dev/null", "http://127.0.0.1:8080/health"]
ENTRYPOINT ["/gpuproxy"]
CMD ["serve", "--listen", "0.0.0.0:8080"]
