package app

import (
	"errors"
	"log/slog"
	"time"
)

// The HTTP server's limits (Serve) and how long shutting down may take.
// The other packages' defaults are their own (each options struct's
// Default* constants).
const (
	// readHeaderTimeout bounds reading a request's head.
	readHeaderTimeout = 10 * time.Second
	// idleTimeout closes a keep-alive connection idle that long.
	idleTimeout = 120 * time.Second
	// shutdownTimeout bounds a graceful HTTP shutdown.
	shutdownTimeout = 20 * time.Second
	// closeTimeout bounds Close's flush.
	closeTimeout = 10 * time.Second
)

// withDefaults returns c with its own unset fields filled: the logger.
// Each package fills its options' defaults itself.
func (c Config) withDefaults() Config {
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// validate says which of c's fields is wrong: fields that contradict each
// other, the store's options (unless Store is given), and the options of
// each enabled provider
// (whose constructors cannot return an error). The other packages'
// options are checked by their own Validate.
func (c Config) validate() error {
	var errs []error
	if c.InferenceProxy != nil && c.NoInferenceProxy {
		errs = append(errs, errors.New("app.Config.InferenceProxy: must be nil with NoInferenceProxy"))
	}
	if c.Store == nil { // else Database is not used
		errs = append(errs, c.Database.Validate())
	}
	if c.VastAI.APIKey != "" {
		errs = append(errs, c.VastAI.Validate())
	}
	if c.IONet.APIKey != "" {
		errs = append(errs, c.IONet.Validate())
	}
	return errors.Join(errs...)
}

// oauthValidate checks the OAuth server's options when it is enabled.
func (c Config) oauthValidate() error {
	if c.NoOAuth {
		return nil
	}
	return c.OAuth.Validate()
}
