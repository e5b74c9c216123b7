module github.com/aiserve/gpuproxy

go 1.26.8

require (
	github.com/go-resty/resty/v2 v2.17.2
	github.com/sony/gobreaker/v2 v2.4.0
)

require (
	github.com/stretchr/testify v1.12.1 // indirect
	golang.org/x/net v0.59.0 // indirect
	golang.org/x/time v0.16.0 // indirect
)
