package ionetsim

import (
	"bufio"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestInferenceEndpoint(t *testing.T) {
	t.Parallel()
	inf, err := startInference("", 5*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer inf.close()

	res, err := http.Get(inf.url + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	var models struct {
		Data []struct{ ID string } `json:"data"`
	}
	_ = json.NewDecoder(res.Body).Decode(&models)
	res.Body.Close()
	if len(models.Data) != 1 || models.Data[0].ID != defaultModel {
		t.Fatalf("models: %+v", models)
	}

	res, err = http.Post(inf.url+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"x","messages":[{"role":"user","content":"hi there"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	var full struct {
		Choices []struct {
			Message struct{ Content string } `json:"message"`
		} `json:"choices"`
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	_ = json.NewDecoder(res.Body).Decode(&full)
	res.Body.Close()
	want := "Simulated reply from " + defaultModel + " to: hi there"
	if len(full.Choices) != 1 || full.Choices[0].Message.Content != want || full.Usage.CompletionTokens == 0 {
		t.Fatalf("completion: %+v", full)
	}

	res, err = http.Post(inf.url+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"messages":[{"role":"user","content":[{"type":"text","text":"hi there"}]}],"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if ct := res.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("content type %q", ct)
	}
	sc := bufio.NewScanner(res.Body)
	var got strings.Builder
	var firstAt, doneAt time.Time
	chunks := 0
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		if firstAt.IsZero() {
			firstAt = time.Now()
		}
		if line == "data: [DONE]" {
			doneAt = time.Now()
			break
		}
		var c struct {
			Choices []struct {
				Delta struct{ Content string } `json:"delta"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &c); err != nil {
			t.Fatalf("bad chunk %q", line)
		}
		chunks++
		got.WriteString(c.Choices[0].Delta.Content)
	}
	if got.String() != want || chunks < 9 || doneAt.IsZero() {
		t.Fatalf("stream gave %q in %d chunks", got.String(), chunks)
	}
	if doneAt.Sub(firstAt) < 30*time.Millisecond {
		t.Fatal("chunks were not flushed one by one")
	}
}
