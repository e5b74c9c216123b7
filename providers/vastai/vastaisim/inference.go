package vastaisim

import "github.com/aiserve/gpuproxy/providers/simllm"

// InferenceServer is the inference endpoint a running instance serves.
type InferenceServer = simllm.Server

// StartInference starts an inference server for model on loopback.
func StartInference(model string) (*InferenceServer, error) { return simllm.Start(model) }
