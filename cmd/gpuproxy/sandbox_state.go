package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/aiserve/gpuproxy/db"
)

// sandboxState is what a running `serve --sandbox` tells other gpuproxy
// processes on this machine about itself, in a state file beside its
// database (written once it listens, removed when it stops): where it
// serves and where its simulated providers are, with the keys the
// simulators accept, so that `gpuproxy mcp` on its database reaches the
// same providers. It never holds an account's API key.
type sandboxState struct {
	PID       int       `json:"pid"`
	URL       string    `json:"url"`      // the sandbox's base URL, http://127.0.0.1:PORT
	Database  string    `json:"database"` // db.Store.Location(): no credentials
	VastAIURL string    `json:"vastai_base_url"`
	VastAIKey string    `json:"vastai_api_key"`
	IONetURL  string    `json:"ionet_base_url"`
	IONetKey  string    `json:"ionet_api_key"`
	StartedAt time.Time `json:"started_at"`
}

// sandboxFor tells whether the database named by databaseURL (as
// DATABASE_URL spells it: "sqlite:PATH", "" for the default SQLite file,
// or a postgres:// URL) belongs to a `serve --sandbox` running on this
// machine now, and if so returns its state. It only reads: a state file
// left by a sandbox that was killed (its process is gone) is not a
// running sandbox.
func sandboxFor(databaseURL string) (sandboxState, bool) {
	statePath, _, err := sandboxFiles(databaseURL)
	if err != nil {
		return sandboxState{}, false
	}
	s, err := readSandboxState(statePath)
	if err != nil || !processAlive(s.PID) {
		return sandboxState{}, false
	}
	return s, true
}

// providers points the providers' configuration at the sandbox's
// simulators, as serve --sandbox does for itself.
func (s sandboxState) providers() providersConf {
	return providersConf{
		VastAI: providerConf{BaseURL: s.VastAIURL, APIKey: s.VastAIKey, Timeout: 10 * time.Second},
		IONet:  providerConf{BaseURL: s.IONetURL, APIKey: s.IONetKey, Timeout: 10 * time.Second},
	}
}

// describe names the sandbox for a person: "the sandbox at URL, pid N".
func (s sandboxState) describe() string {
	return fmt.Sprintf("the sandbox at %s, pid %d", s.URL, s.PID)
}

// sandboxFiles are the state file and the lock file of a sandbox on the
// database named by databaseURL: beside a SQLite file (FILE-sandbox.json
// and FILE-sandbox.lock), and for Postgres in the user's cache folder,
// named by a hash of the URL (so no credential is in a file name).
func sandboxFiles(databaseURL string) (state, lock string, err error) {
	var base string
	switch {
	case databaseURL == "" || strings.HasPrefix(databaseURL, "sqlite:"):
		// As db.Open reads it.
		path := strings.TrimPrefix(strings.TrimPrefix(databaseURL, "sqlite:"), "//")
		if path == "" {
			path = db.DefaultSQLitePath
		}
		if base, err = filepath.Abs(path); err != nil {
			return "", "", err
		}
	case strings.HasPrefix(databaseURL, "postgres://"), strings.HasPrefix(databaseURL, "postgresql://"):
		dir, err := os.UserCacheDir()
		if err != nil {
			dir = os.TempDir()
		}
		sum := sha256.Sum256([]byte(databaseURL))
		base = filepath.Join(dir, "gpuproxy", "sandbox-"+hex.EncodeToString(sum[:12]))
	default:
		return "", "", errors.New("DATABASE_URL must start with postgres://, postgresql:// or sqlite: (a SQLite path)")
	}
	return base + "-sandbox.json", base + "-sandbox.lock", nil
}

// readSandboxState reads a state file.
func readSandboxState(path string) (sandboxState, error) {
	var s sandboxState
	b, err := os.ReadFile(path)
	if err != nil {
		return s, err
	}
	if err := json.Unmarshal(b, &s); err != nil {
		return s, fmt.Errorf("reading %s: %w", path, err)
	}
	if s.PID <= 0 || s.URL == "" {
		return s, fmt.Errorf("reading %s: no pid or url", path)
	}
	return s, nil
}

// writeSandboxState writes s to path (mode 0600, through a rename, so a
// reader never sees half of it).
func writeSandboxState(path string, s sandboxState) error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	return writeEnvFile(path, string(b)+"\n")
}

// errSandboxBusy is lockSandbox's answer when another process holds the
// lock.
var errSandboxBusy = errors.New("another sandbox holds the lock")
