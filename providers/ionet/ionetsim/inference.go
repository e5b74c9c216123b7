package ionetsim

import (
	"time"

	"github.com/aiserve/gpuproxy/providers/simllm"
)

// defaultModel is served when the deployment sets no MODEL variable.
const defaultModel = "ionetsim/echo-1"

// inference is one container's inference listener.
type inference struct {
	*simllm.Server
	url string
}

// startInference listens on a fresh loopback port.
func startInference(model string, chunkDelay time.Duration) (*inference, error) {
	if model == "" {
		model = defaultModel
	}
	s, err := simllm.Start(model)
	if err != nil {
		return nil, err
	}
	s.SetChunkDelay(chunkDelay)
	return &inference{Server: s, url: s.URL()}, nil
}

// close stops the listener and drops open connections, streams included.
func (f *inference) close() { f.Close() }
