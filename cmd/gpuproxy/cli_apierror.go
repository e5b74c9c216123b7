package main

import (
	"encoding/json"

	"github.com/aiserve/gpuproxy"
)

// apiError reads the server's error answer, {"error":{"code","message",
// "details"}}; ok is false when raw is not one (no code).
func apiError(raw []byte) (e *gpuproxy.Error, ok bool) {
	var body struct {
		Error struct {
			Code    string         `json:"code"`
			Message string         `json:"message"`
			Details map[string]any `json:"details"`
		} `json:"error"`
	}
	if json.Unmarshal(raw, &body) != nil || body.Error.Code == "" {
		return nil, false
	}
	return &gpuproxy.Error{Code: body.Error.Code, Message: body.Error.Message, Details: body.Error.Details}, true
}
