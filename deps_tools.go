//go:build tools

// This file pins modules that later code uses, so go mod tidy keeps them
// while the packages that import them are written. Delete when all are used.
package gpuproxy

import (
	_ "github.com/compose-spec/compose-go/v2/loader"
	_ "github.com/golang-jwt/jwt/v5"
	_ "github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/labstack/echo/v4"
	_ "github.com/modelcontextprotocol/go-sdk/mcp"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "golang.org/x/time/rate"
	_ "gopkg.in/yaml.v3"
	_ "modernc.org/sqlite"
)
